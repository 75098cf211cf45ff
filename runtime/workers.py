"""A small fixed pool of threads for blocking request work, fair between sessions.

Why: a thread per request let one client that pipelined 1,000 ``health_poll``
start ~150 threads and delay everyone. Here a few threads serve all such work,
taking one job of each session in turn, so a session with many jobs queued
waits behind itself, not the others in front of it.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from collections.abc import Callable, Hashable

_log = logging.getLogger("hilconform.runtime")


class FairWorkerPool:
    """``size`` daemon threads; ``submit(key, job)`` queues per key, keys are served round-robin."""

    def __init__(self, size: int, name: str = "worker"):
        self.size = size
        self.name = name
        self._cond = threading.Condition()
        self._queues: dict[Hashable, deque[Callable[[], None]]] = {}
        self._turns: deque[Hashable] = deque()  # keys with queued jobs, in serving order
        self._threads: list[threading.Thread] = []
        self._stopping = False

    def start(self) -> None:
        for index in range(self.size):
            thread = threading.Thread(target=self._run, name=f"{self.name}-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, key: Hashable, job: Callable[[], None]) -> None:
        with self._cond:
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
                self._turns.append(key)
            queue.append(job)
            self._cond.notify()

    def queued(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def stop(self, timeout_s: float = 2.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while not self._turns and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            key = self._turns.popleft()
            queue = self._queues[key]
            job = queue.popleft()
            if queue:
                self._turns.append(key)  # its next job comes after the other keys' jobs
            else:
                del self._queues[key]
            return job

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - a job's bug must not cost a worker
                _log.error(f"{self.name}: job failed: {exc!r}\n{traceback.format_exc()}")
