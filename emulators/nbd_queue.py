"""The NBD export behind a queue device: the "hardware" that tests can stall.

Each queue-bearing stand-in (nvme) reads and writes a small sparse disk
through `qemu-nbd` on a unix socket. Stopping that process with SIGSTOP makes
the device's in-flight commands hang (a stuck command queue); SIGCONT lets
them complete. See notes/qemu-7.2.md: a reset of a stuck nvme freezes the VM
until the backend answers, so whoever stalls a queue also decides when it resumes.
"""

from __future__ import annotations

import os
import signal

from .layout import InstanceLayout
from .processes import ChildProcess, wait_for_listener
from .toolchain import find_tool


class NbdQueueBackend:
    def __init__(self, layout: InstanceLayout, slot_name: str, disk_mib: int):
        self.layout = layout
        self.slot_name = slot_name
        self.disk_mib = disk_mib
        self.process: ChildProcess | None = None
        self.stalled = False

    def start(self, timeout_s: float = 10.0) -> None:
        image = self.layout.nbd_image(self.slot_name)
        with open(image, "wb") as fh:
            fh.truncate(self.disk_mib << 20)
        sock = self.layout.nbd_socket(self.slot_name)
        sock.unlink(missing_ok=True)
        cache = "none" if _supports_direct(image) else "writeback"
        argv = [
            find_tool("qemu-nbd"), "--persistent", "--shared=4", "--format=raw",
            f"--socket={sock}", f"--export-name={self.slot_name}", f"--cache={cache}", str(image),
        ]
        self.process = ChildProcess(f"nbd-{self.slot_name}", argv,
                                    self.layout.nbd_log(self.slot_name), self.layout.pids)
        # qemu-nbd binds (the path appears) before it listens: QEMU's connect in between is refused
        wait_for_listener(sock, timeout_s, self.process)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stall(self) -> None:
        """Stop answering: the device's queue hangs with its requests in flight."""
        assert self.process is not None
        self.process.signal(signal.SIGSTOP)
        self.stalled = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.signal(signal.SIGCONT)
        self.stalled = False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _supports_direct(path) -> bool:
    # O_DIRECT is refused on tmpfs; writeback caching is fine for a scratch disk.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True
