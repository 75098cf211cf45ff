"""The vfio-user wire format: a 16-byte header, a payload, file descriptors alongside.

Only what QEMU's client (`vfio-user-pci`, QEMU >= 10.1) sends is understood.
Framing rules that matter (see docs/toolchain-vfio-user.md): a request that
carries NO_REPLY is never answered; replies carry exactly the payload size the
client expects; fds arrive with the header as SCM_RIGHTS.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field

HEADER = struct.Struct("<HHIII")  # id, command, size (header included), flags, error

# Commands.
VERSION = 1
DMA_MAP = 2
DMA_UNMAP = 3
DEVICE_GET_INFO = 4
DEVICE_GET_REGION_INFO = 5
DEVICE_GET_REGION_IO_FDS = 6
DEVICE_GET_IRQ_INFO = 7
DEVICE_SET_IRQS = 8
REGION_READ = 9
REGION_WRITE = 10
DMA_READ = 11
DMA_WRITE = 12
DEVICE_RESET = 13

COMMAND_NAMES = {
    VERSION: "VERSION", DMA_MAP: "DMA_MAP", DMA_UNMAP: "DMA_UNMAP",
    DEVICE_GET_INFO: "DEVICE_GET_INFO", DEVICE_GET_REGION_INFO: "DEVICE_GET_REGION_INFO",
    DEVICE_GET_REGION_IO_FDS: "DEVICE_GET_REGION_IO_FDS", DEVICE_GET_IRQ_INFO: "DEVICE_GET_IRQ_INFO",
    DEVICE_SET_IRQS: "DEVICE_SET_IRQS", REGION_READ: "REGION_READ", REGION_WRITE: "REGION_WRITE",
    DMA_READ: "DMA_READ", DMA_WRITE: "DMA_WRITE", DEVICE_RESET: "DEVICE_RESET",
}

# Header flags.
TYPE_REQUEST = 0x0
TYPE_REPLY = 0x1
TYPE_MASK = 0xF
NO_REPLY = 0x10
ERROR = 0x20

# vfio region / irq / device flags (from linux/vfio.h).
REGION_FLAG_READ = 1 << 0
REGION_FLAG_WRITE = 1 << 1
REGION_FLAG_MMAP = 1 << 2
DEVICE_FLAGS_RESET = 1 << 0
DEVICE_FLAGS_PCI = 1 << 1
IRQ_INFO_EVENTFD = 1 << 0
IRQ_INFO_MASKABLE = 1 << 1
IRQ_INFO_AUTOMASKED = 1 << 2
IRQ_INFO_NORESIZE = 1 << 3

# PCI region and IRQ indexes (VFIO_PCI_*_REGION_INDEX / *_IRQ_INDEX).
BAR_REGIONS = range(6)
ROM_REGION = 6
CONFIG_REGION = 7
VGA_REGION = 8
NUM_REGIONS = 9
NUM_IRQS = 5  # INTx, MSI, MSI-X, ERR, REQ
MSIX_IRQ_INDEX = 2

PROTOCOL_MAJOR = 0
PROTOCOL_MINOR = 0
MAX_MESSAGE_FDS = 8
MAX_DATA_XFER = 1 << 20
MAX_MESSAGE = MAX_DATA_XFER + 4096

# Payload layouts.
DEVICE_INFO = struct.Struct("<IIII")  # argsz, flags, num_regions, num_irqs
REGION_INFO = struct.Struct("<IIIIQQ")  # argsz, flags, index, cap_offset, size, offset
IRQ_INFO = struct.Struct("<IIII")  # argsz, flags, index, count
IRQ_SET = struct.Struct("<IIIII")  # argsz, flags, index, start, count
REGION_ACCESS = struct.Struct("<QII")  # offset, region, count
DMA_MAP_ARGS = struct.Struct("<IIQQQ")  # argsz, flags, offset, iova, size


class MalformedMessage(RuntimeError):
    """The peer sent something this server cannot make sense of; the connection ends."""


class PeerClosed(ConnectionError):
    """The peer closed the connection (QEMU quit, or the device was unplugged)."""


@dataclass
class Message:
    msg_id: int
    command: int
    flags: int
    error: int
    payload: bytes
    fds: list[int] = field(default_factory=list)

    @property
    def wants_reply(self) -> bool:
        return not self.flags & NO_REPLY

    @property
    def name(self) -> str:
        return COMMAND_NAMES.get(self.command, f"command {self.command}")


def encode(msg_id: int, command: int, payload: bytes = b"", flags: int = TYPE_REQUEST,
           error: int = 0) -> bytes:
    return HEADER.pack(msg_id, command, HEADER.size + len(payload), flags, error) + payload


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(count)
        if not chunk:
            raise PeerClosed("peer closed the connection mid-message")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> Message:
    """One whole message, with the fds that came with its header."""
    try:
        head, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, MAX_MESSAGE_FDS)
    except TimeoutError:
        raise  # a deadline of the caller's, not a lost peer
    except OSError as exc:
        raise PeerClosed(f"connection lost: {exc}") from None
    if not head:
        for fd in fds:
            _close_quietly(fd)
        raise PeerClosed("peer closed the connection")
    if len(head) < HEADER.size:
        head += _recv_exact(sock, HEADER.size - len(head))
    msg_id, command, size, flags, error = HEADER.unpack(head)
    if size < HEADER.size or size > MAX_MESSAGE:
        for fd in fds:
            _close_quietly(fd)
        raise MalformedMessage(f"message {msg_id}: impossible size {size}")
    payload = _recv_exact(sock, size - HEADER.size) if size > HEADER.size else b""
    return Message(msg_id, command, flags, error, payload, list(fds))


def send(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def reply(sock: socket.socket, request: Message, payload: bytes = b"",
          fds: list[int] | None = None) -> None:
    send(sock, encode(request.msg_id, request.command, payload, TYPE_REPLY), fds)


def reply_error(sock: socket.socket, request: Message, errno_value: int) -> None:
    send(sock, encode(request.msg_id, request.command, b"", TYPE_REPLY | ERROR, errno_value))


def version_payload(capabilities: dict) -> bytes:
    """VERSION payload: major, minor, NUL-terminated JSON capabilities."""
    text = json.dumps({"capabilities": capabilities}, separators=(",", ":")).encode() + b"\0"
    return struct.pack("<HH", PROTOCOL_MAJOR, PROTOCOL_MINOR) + text


def parse_version(payload: bytes) -> tuple[int, int, dict]:
    if len(payload) < 4:
        raise MalformedMessage("VERSION payload shorter than 4 bytes")
    major, minor = struct.unpack_from("<HH", payload)
    text = payload[4:].split(b"\0", 1)[0]
    try:
        caps = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise MalformedMessage(f"VERSION capabilities are not JSON: {exc}") from None
    return major, minor, caps


def _close_quietly(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
