"""A stalled command queue, whichever backend holds it: the record and the handle that resumes it.

Both queue kinds stall through it (queue.py: an nvme stand-in's NBD export; model.py: a device
model's command queue); only the backend's `resume()` differs.
"""

from __future__ import annotations

import threading
import time

from ..errors import WaitTimeout
from .base import FaultRecord

STALL_TIMEOUT_S = 5.0
STALL_SAMPLE_GAP_S = 0.25  # completions must not advance over this gap while a request waits


class QueueStall:
    """A stalled command queue: the stall's record and the handle that resumes it.

    With `resume_after_s` a timer resumes the backend that long after
    `stall_queue` returned, with no QMP or guest call (a VM frozen by a reset of
    the stuck device is thawed by it). `resume()` resumes now (idempotent).
    """

    def __init__(self, record: FaultRecord, backend, resume_after_s: float | None):
        self.record = record
        self.slot = record.target
        self.resume_after_s = resume_after_s
        self._backend = backend
        self.probe_job = None  # the read stall_queue issued to be the stuck request, if any
        self._lock = threading.Lock()
        self._resumed = threading.Event()
        self.resumed_ns: int | None = None
        self._timer: threading.Timer | None = None
        self.resume_at_ns: int | None = None
        if resume_after_s is not None:
            self.resume_at_ns = time.monotonic_ns() + int(resume_after_s * 1e9)
            self._timer = threading.Timer(resume_after_s, self._resume_quietly)
            self._timer.name = f"resume-{self.slot}"
            self._timer.daemon = True
            self._timer.start()

    def __repr__(self) -> str:
        state = "stalled" if self.resumed_ns is None else "resumed"
        return f"QueueStall({self.slot}, {state}, resume_after_s={self.resume_after_s})"

    @property
    def auto_resumes(self) -> bool:
        return self._timer is not None and self.resumed_ns is None

    @property
    def resumed(self) -> bool:
        return self._resumed.is_set()

    def resume(self) -> int:
        """SIGCONT the backend now (if not done yet); the host time it was resumed."""
        with self._lock:
            if self.resumed_ns is None:
                if self._timer is not None:
                    self._timer.cancel()
                self._backend.resume()
                self.resumed_ns = time.monotonic_ns()
                self._resumed.set()
            return self.resumed_ns

    @property
    def sees_guest_look(self) -> bool:
        """Whether the backend sees the guest read its queue (a device model), so that
        `answer_at_next_look` waits for that read rather than answering at once."""
        return hasattr(self._backend, "resume_after_next_look")

    def answer_at_next_look(self) -> int:
        """Let the "hardware" answer once the guest looks at the queue again (a device model sees
        its in-flight count read: that read still finds the commands in flight); a backend that
        cannot see the guest look (an NBD export) answers now. The host time it was armed.
        `resume()` afterwards still ends the stall for certain."""
        arm = getattr(self._backend, "resume_after_next_look", None)
        if arm is None:
            return self.resume()
        with self._lock:
            if self.resumed_ns is None:
                if self._timer is not None:
                    self._timer.cancel()
                arm()
            return time.monotonic_ns()

    def model_record(self):
        """The device model's own record of this stall (emulators/vfio_user/registers.HoldLog: when
        it was armed, every read of its in-flight count and what it returned, the look that let the
        commands go, the first read that found the queue empty), or None where the backend keeps
        none (an NBD export: the host knows only when it let the backend go)."""
        read = getattr(self._backend, "hold_log", None)
        return None if read is None else read()

    def wait_resumed(self, timeout_s: float) -> int:
        if not self._resumed.wait(timeout_s):
            raise WaitTimeout(f"queue of {self.slot} not resumed within {timeout_s:.1f}s")
        return self.resumed_ns

    def _resume_quietly(self) -> None:
        try:
            self.resume()
        except Exception:  # the VM (and its backend) may be gone already
            pass
