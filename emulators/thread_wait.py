"""How long chosen host threads waited for a CPU, as the kernel counts it (schedstat's run delay).

Why: an emulated node runs on a handful of host threads: QEMU's virtual CPUs and its vfio-user
I/O thread, the device models' server threads, the NBD queue backends. On a loaded runner those
threads are ready to run and wait for a CPU, and everything the guest does takes that much longer:
the test bed's slowness, not the system under test's. The kernel keeps that wait per thread
(/proc/PID/task/TID/schedstat, second field, ns). A sampler reads it every PERIOD_S and keeps the
running sum over the threads, so that the wait inside any interval can be read afterwards.

The kernel adds a wait to the count when the thread gets a CPU, so a wait is seen at its end: one
that straddles an interval's start counts whole inside it, one that straddles its end not at all
(each off by at most one wait, a few ms on a busy runner, rarely more).

A thread that sleeps (blocked on I/O, a timer, a lock, a guest that halts its CPU) accrues
nothing: a runtime that waits on its own gets no allowance, and one that computes is charged its
own run time; only the time the host kept a ready thread off the CPUs counts. A program in the
guest that times its own late wakes cannot do that: it also counts the guest's own scheduling of
its other work (the runtime's included), and misses what falls between its wakes
(docs/performance.md, "Which witness of the test bed's stalls").
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PERIOD_S = 0.005  # between two reads of every watched thread's schedstat
RESCAN_S = 0.2  # between two looks for threads that came or went (a device model served on hot-add)


@dataclass(frozen=True)
class WaitSeries:
    """The running sum of the watched threads' run delay (`waited_ns`) at host times `at_ns`
    (CLOCK_MONOTONIC), both ascending."""

    at_ns: tuple[int, ...]
    waited_ns: tuple[int, ...]

    def waited_between(self, start_ns: int, end_ns: int) -> int:
        """The watched threads' wait inside [start_ns, end_ns] of the host's clock (ns), each end read
        between its two nearest samples as if the wait had grown evenly between them."""
        if end_ns <= start_ns or not self.at_ns:
            return 0
        return max(0, self._sum_at(end_ns) - self._sum_at(start_ns))

    def _sum_at(self, t_ns: int) -> int:
        i = bisect.bisect_right(self.at_ns, t_ns)
        if i == 0:
            return self.waited_ns[0]
        if i == len(self.at_ns):
            return self.waited_ns[-1]
        t0, t1 = self.at_ns[i - 1], self.at_ns[i]
        w0, w1 = self.waited_ns[i - 1], self.waited_ns[i]
        return w0 + (w1 - w0) * (t_ns - t0) // max(1, t1 - t0)


def read_run_delay_ns(fd: int) -> int | None:
    """The run delay (ns) of the schedstat file open on `fd`; None once its thread has ended."""
    try:
        fields = os.pread(fd, 128, 0).split()
    except OSError:
        return None
    return int(fields[1]) if len(fields) >= 2 else None


class ThreadWaitSampler:
    """Samples the run delay of the threads `threads()` names ((pid, tid) pairs, asked again every
    RESCAN_S) until `stop()`, which returns the WaitSeries. A thread's wait counts from its first
    sample on; an ended thread keeps what it had."""

    def __init__(self, threads: Callable[[], Iterable[tuple[int, int]]], period_s: float = PERIOD_S):
        self._threads = threads
        self._period_s = period_s
        self._files: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, tid) -> (fd, last run delay)
        self._total_ns = 0
        self._at: list[int] = []
        self._waited: list[int] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="thread-wait-sampler", daemon=True)

    def start(self) -> ThreadWaitSampler:
        self._rescan()
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> WaitSeries:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        for fd, _ in self._files.values():
            os.close(fd)
        self._files.clear()
        if self._error is not None:
            raise self._error
        return WaitSeries(tuple(self._at), tuple(self._waited))

    def _run(self) -> None:
        try:
            raise_priority()
            next_rescan = time.monotonic() + RESCAN_S
            while not self._stop.wait(self._period_s):
                if time.monotonic() >= next_rescan:
                    self._rescan()
                    next_rescan = time.monotonic() + RESCAN_S
                self._sample()
        except BaseException as exc:  # noqa: BLE001 (stop() raises it in the caller's thread)
            self._error = exc

    def _rescan(self) -> None:
        for key in set(self._threads()) - set(self._files):
            pid, tid = key
            try:
                fd = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue  # ended between the listing and the open
            delay = read_run_delay_ns(fd)
            if delay is None:
                os.close(fd)
                continue
            self._files[key] = (fd, delay)

    def _sample(self) -> None:
        for key, (fd, last) in list(self._files.items()):
            delay = read_run_delay_ns(fd)
            if delay is None:  # ended: what it waited stays in the sum
                os.close(fd)
                del self._files[key]
                continue
            self._total_ns += delay - last
            self._files[key] = (fd, delay)
        self._at.append(time.monotonic_ns())
        self._waited.append(self._total_ns)


def raise_priority() -> None:
    """Run the calling thread at nice -10 where allowed (root), so that the sampler reads on time
    on the loaded runner it measures; the samples carry their own times either way."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
    except OSError:
        pass


def process_threads(pid: int, named: Callable[[str], bool] = lambda name: True) -> list[tuple[int, int]]:
    """(pid, tid) of each thread of `pid` whose name (comm) `named` accepts; none once it has ended."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        if named(name):
            found.append((pid, int(tid)))
    return found
