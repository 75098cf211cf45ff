"""The kernel's uevents, read straight from netlink (DISC-02, DISC-04).

Why not pyudev on this path: in a storm the node is busy (slot enumeration, driver probes,
udev's workers), and the reader gets little CPU. Each uevent here costs one ``recvmsg`` and
a split. (Netlink sockets carry no receive timestamp: ``SO_TIMESTAMPNS`` is accepted but
no control message comes, measured on Linux 6.1; a change is stamped when it is read.)
Only messages the kernel sent (netlink sender pid 0) are taken; udevd's re-broadcasts go to
another multicast group and are never seen here.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time

from .discovery import PciChange, change_from_uevent

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1  # the kernel's own uevents (udevd re-broadcasts on group 2)
SO_RCVBUFFORCE = 33
MAX_MESSAGE = 1 << 16
log = logging.getLogger(__name__)


def parse_uevent(data: bytes) -> tuple[str, str, dict[str, str]] | None:
    """(action, devpath, properties) of one kernel uevent message, or None if it is not one.

    The kernel sends ``ACTION@DEVPATH`` then ``KEY=VALUE`` fields, each NUL-terminated.
    """
    fields = data.split(b"\0")
    header = fields[0].decode(errors="replace")
    if "@" not in header:
        return None
    props = {}
    for raw in fields[1:]:
        key, sep, value = raw.partition(b"=")
        if sep:
            props[key.decode(errors="replace")] = value.decode(errors="replace")
    action = props.get("ACTION") or header.partition("@")[0]
    devpath = props.get("DEVPATH") or header.partition("@")[2]
    return action, devpath, props


class KernelUeventSource:
    """A ChangeSource of the kernel's uevents of the subsystems "pci" and "nvme".

    It listens from construction on: create it before enumerating.
    """

    SUBSYSTEMS = ("pci", "nvme")

    def __init__(self, receive_buffer: int = 8 << 20):
        self._sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT
        )
        try:
            try:  # a storm must not overflow the socket while the reader waits for CPU
                self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, receive_buffer)
            except OSError:  # needs CAP_NET_ADMIN; the capped size still helps
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self._sock.bind((0, KERNEL_GROUP))
        except OSError:
            self._sock.close()
            raise
        self.overflows = 0  # times the kernel dropped uevents because the socket was full

    def next(self, timeout_s: float) -> PciChange | None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            self._sock.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                data, _ancillary, _flags, sender = self._sock.recvmsg(MAX_MESSAGE)
            except (TimeoutError, BlockingIOError):
                return None
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.overflows += 1  # uevents were lost; the health poll still sees the devices
                log.warning("kernel uevents lost: the receive buffer overflowed (%d times)", self.overflows)
                continue
            change = self._change(data, sender)
            if change is not None:
                return change
            if time.monotonic() >= deadline:
                return None

    def _change(self, data: bytes, sender) -> PciChange | None:
        if sender[0] != 0:  # not sent by the kernel
            return None
        parsed = parse_uevent(data)
        if parsed is None:
            return None
        action, devpath, props = parsed
        if props.get("SUBSYSTEM") not in self.SUBSYSTEMS:
            return None
        received_ns = time.monotonic_ns()
        return change_from_uevent(
            action, props["SUBSYSTEM"], os.path.basename(devpath), devpath, props, received_ns
        )

    def close(self) -> None:
        self._sock.close()
