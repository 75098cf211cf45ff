"""Proof that a PID still names the process we recorded, for pid files that survive a crash.

A PID alone proves nothing: PIDs are reused after a reboot and on wrap-around. A record
therefore carries what identifies the process instance:

* ``boot_id`` (``/proc/sys/kernel/random/boot_id``): start times restart at every boot;
* ``start_ticks`` (``/proc/PID/stat`` field 22, clock ticks since boot): fixed by the kernel
  at fork and unchanged by exec, so a second process could carry the same PID and start time
  only if pid_max were wrapped within one tick.

These two are the proof and the only fields compared. ``argv0`` (the process's argv[0] when
recorded) is kept for messages only: a wrapper that execs (the vfio-user prefix's
``qemu-system-x86_64`` is a shell script that execs the prefix's loader) changes the command
line after it was recorded, and comparing it would make a QEMU of ours unkillable.

A pid file holds one JSON line, ``{"pid": ..., "boot_id": ..., "start_ticks": ..., "argv0": ...}``.
A bare PID (the old format, or a record taken when /proc could not be read) has no identity:
it is never trusted.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

_START_TICKS_FIELD = 22


@cache
def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _start_ticks(pid: int) -> int:
    """Field 22 of /proc/PID/stat; ProcessLookupError when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    # Field 2 (comm) is parenthesised and may hold spaces or ')': split after the last one.
    after_comm = stat.rsplit(")", 1)[1].split()
    try:
        return int(after_comm[_START_TICKS_FIELD - 3])
    except (IndexError, ValueError):
        raise OSError(f"/proc/{pid}/stat has no start time: {stat!r}") from None


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    boot_id: str
    start_ticks: int
    argv0: str = ""  # for messages only; never compared

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """The identity of the live process `pid`; ProcessLookupError if there is none."""
        return cls(pid, boot_id(), _start_ticks(pid), _argv0(pid))

    def mismatch(self) -> str | None:
        """None when `pid` is still this process; otherwise why it is not (one phrase).

        OSError when /proc cannot tell (neither a match nor a mismatch is proved).
        """
        if self.boot_id != boot_id():
            return f"PID {self.pid} was recorded in another boot ({self.boot_id})"
        try:
            now = _start_ticks(self.pid)
        except ProcessLookupError:
            return f"no process {self.pid}"
        if now != self.start_ticks:
            return (
                f"PID {self.pid} now belongs to another process (started at tick {now}, "
                f"recorded {self.start_ticks})"
            )
        return None

    def matches(self) -> bool:
        try:
            return self.mismatch() is None
        except OSError:
            return False

    def to_text(self) -> str:
        return json.dumps(asdict(self)) + "\n"


@dataclass(frozen=True)
class PidRecord:
    """What a pid file says: the PID, and its identity unless the file is a bare PID."""

    pid: int
    identity: ProcessIdentity | None

    def mismatch(self) -> str | None:
        """None when the record provably names a live process; otherwise why not (or OSError)."""
        if self.identity is None:
            return f"PID {self.pid} is recorded without identity (old-format pid file)"
        return self.identity.mismatch()


def read_pid_file(path: Path) -> PidRecord:
    """Parse a pid file; OSError if unreadable, ValueError if it is neither format."""
    text = path.read_text().strip()
    if text.isdigit():
        return PidRecord(int(text), None)
    try:
        fields = json.loads(text)
        identity = ProcessIdentity(
            int(fields["pid"]),
            str(fields["boot_id"]),
            int(fields["start_ticks"]),
            str(fields.get("argv0", "")),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a pid record: {text[:80]!r} ({type(exc).__name__})") from None
    return PidRecord(identity.pid, identity)


def write_pid_file(path: Path, pid: int) -> None:
    """Record `pid` with its identity, atomically (a reader never sees half a record).

    If /proc cannot tell the identity (the process is already gone), a bare PID is written:
    such a record is never trusted, so nothing will be killed on its account.
    """
    try:
        text = ProcessIdentity.of(pid).to_text()
    except OSError:
        text = f"{pid}\n"
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def kill_if_same(identity: ProcessIdentity) -> str | None:
    """SIGKILL the process if it is still `identity`; None if killed, else why not.

    The PID is pinned with a pidfd before the identity is checked, so the signal cannot reach
    a process that took the PID over between the check and the kill.
    """
    try:
        pidfd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return f"no process {identity.pid}"
    except OSError as exc:
        return f"cannot open PID {identity.pid} ({exc})"
    try:
        why = identity.mismatch()
        if why is not None:
            return why
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return f"no process {identity.pid}"
    except OSError as exc:
        return f"cannot check or signal PID {identity.pid} ({exc})"
    finally:
        os.close(pidfd)
    return None
