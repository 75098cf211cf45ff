"""A minimal vfio-user client, to drive a model server without QEMU (unit tests, benchmarks).

It speaks the same messages QEMU's `vfio-user-pci` sends, synchronously, one
request at a time, with a deadline on every reply.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from . import protocol as p


class ClientError(RuntimeError):
    """The server answered with an error reply (errno in .errno)."""

    def __init__(self, message: str, errno_value: int):
        super().__init__(message)
        self.errno = errno_value


class VfioUserClient:
    def __init__(self, socket_path: Path, timeout_s: float = 5.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(str(socket_path))
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> VfioUserClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, command: int, payload: bytes = b"", fds: list[int] | None = None,
                no_reply: bool = False) -> p.Message | None:
        self._next_id = (self._next_id + 1) & 0xFFFF
        flags = p.TYPE_REQUEST | (p.NO_REPLY if no_reply else 0)
        p.send(self.sock, p.encode(self._next_id, command, payload, flags), fds)
        if no_reply:
            return None
        answer = p.receive(self.sock)
        if answer.msg_id != self._next_id or answer.flags & p.TYPE_MASK != p.TYPE_REPLY:
            raise p.MalformedMessage(f"expected reply {self._next_id}, got {answer}")
        if answer.flags & p.ERROR:
            for fd in answer.fds:
                os.close(fd)
            raise ClientError(f"{answer.name} failed: errno {answer.error}", answer.error)
        return answer

    def version(self) -> dict:
        reply = self.request(p.VERSION, p.version_payload({}))
        return p.parse_version(reply.payload)[2]

    def device_info(self) -> tuple[int, int, int]:
        reply = self.request(p.DEVICE_GET_INFO, p.DEVICE_INFO.pack(p.DEVICE_INFO.size, 0, 0, 0))
        _argsz, flags, regions, irqs = p.DEVICE_INFO.unpack(reply.payload)
        return flags, regions, irqs

    def region_info(self, index: int) -> tuple[int, int, int | None]:
        """(flags, size, fd or None); the caller owns the fd."""
        args = p.REGION_INFO.pack(p.REGION_INFO.size, 0, index, 0, 0, 0)
        reply = self.request(p.DEVICE_GET_REGION_INFO, args)
        _argsz, flags, _index, _cap, size, _offset = p.REGION_INFO.unpack(reply.payload)
        return flags, size, (reply.fds[0] if reply.fds else None)

    def read(self, region: int, offset: int, count: int) -> bytes:
        reply = self.request(p.REGION_READ, p.REGION_ACCESS.pack(offset, region, count))
        if len(reply.payload) != p.REGION_ACCESS.size + count:
            raise p.MalformedMessage(f"read reply carries {len(reply.payload)} bytes")
        return reply.payload[p.REGION_ACCESS.size:]

    def write(self, region: int, offset: int, data: bytes, posted: bool = False) -> None:
        self.request(p.REGION_WRITE, p.REGION_ACCESS.pack(offset, region, len(data)) + data,
                     no_reply=posted)

    def read32(self, region: int, offset: int) -> int:
        return int.from_bytes(self.read(region, offset, 4), "little")

    def write32(self, region: int, offset: int, value: int, posted: bool = False) -> None:
        self.write(region, offset, value.to_bytes(4, "little"), posted)

    def reset(self) -> None:
        self.request(p.DEVICE_RESET)
