"""Child processes that can never outlive us.

Every QEMU, qemu-nbd or helper is started here: it gets PR_SET_PDEATHSIG so
the kernel kills it if our process dies (a crashed pytest-xdist worker, a
SIGKILL), its own session so a terminal's Ctrl-C reaches only us (we then stop
it in order), and its PID is recorded in the instance folder with its process
identity (process_identity.py), so a later run can end it if it outlived a
crashed owner, and can tell when that PID has since gone to someone else.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .process_identity import write_pid_file

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ChildProcess:
    """A started child with a name, a log file and an ordered stop."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, pid_dir: Path):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        self.pid_file = pid_dir / f"{name}.pid"
        # Popen returns once the exec has succeeded, so /proc already shows the program
        # itself; the start time that proves identity was fixed at fork anyway.
        write_pid_file(self.pid_file, self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, signum)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 3.0) -> int | None:
        """SIGTERM, wait up to grace_s, then SIGKILL. Safe to call twice."""
        if self.alive():
            try:
                # A stopped process (SIGSTOP'd NBD server) must be continued to die by TERM.
                os.kill(self.popen.pid, signal.SIGCONT)
                os.kill(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._log.close()
        self.pid_file.unlink(missing_ok=True)
        return self.popen.returncode


def wait_for_path(path: Path, timeout_s: float, child: ChildProcess | None = None) -> None:
    """Wait until a file or socket exists; fail early if the child exited."""
    from .waiting import poll_until

    poll_until(path.exists, timeout_s, f"{path} to appear", every_s=0.02,
               check=lambda: _raise_if_exited(child, f"creating {path}"))


def _raise_if_exited(child: ChildProcess | None, before: str) -> None:
    """InfrastructureError with the child's last output when it exited before ``before``."""
    from .errors import InfrastructureError

    if child is not None and not child.alive():
        raise InfrastructureError(
            f"{child.name} exited with status {child.returncode()} before {before}; "
            f"its output:\n{child.log_tail()}"
        )


def wait_for_listener(path: Path, timeout_s: float, child: ChildProcess | None = None) -> None:
    """Wait until a unix socket accepts connections; fail early if the child exited.

    A server's socket path appears at bind(), before it listens: a connect in between is
    refused. So the path is not enough; a probe connect (closed at once) must succeed."""
    from .waiting import poll_until

    deadline = time.monotonic() + timeout_s
    wait_for_path(path, timeout_s, child)

    def accepts() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                return True
            except (ConnectionRefusedError, FileNotFoundError):
                return False

    poll_until(accepts, max(0.0, deadline - time.monotonic()),
               f"a listener on {path} (the path exists, but nothing listened on it)",
               every_s=0.02, check=lambda: _raise_if_exited(child, f"listening on {path}"))


def stray_children(parent_pid: int | None = None) -> list[tuple[int, str]]:
    """Live QEMU-family children of a process (default: this one), as (pid, name)."""
    parent_pid = parent_pid or os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if int(fields[1]) == parent_pid and fields[0] != "Z" and name.startswith("qemu"):
            found.append((int(entry.name), name))
    return found
