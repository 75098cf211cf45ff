"""How long chosen host threads waited for a CPU, as the kernel counts it (schedstat's run delay).

Why: an emulated node runs on a handful of host threads: QEMU's virtual CPUs and its vfio-user
I/O thread, the device models' server threads, the NBD queue backends. On a loaded runner those
threads are ready to run and wait for a CPU, and everything the guest does takes that much longer:
the test bed's slowness, not the system under test's. The kernel keeps that wait per thread
(/proc/PID/task/TID/schedstat, second field, ns). A sampler reads it every PERIOD_S.

The kernel adds a wait to the count when the thread gets a CPU, so a wait is seen at its end: a
thread credited d ns since the last sample waited during about [t - d, t] (t: this sample, off by
at most one period). The sampler keeps the union of those intervals over every thread: threads
that wait at once stall the guest once. (A running sum over the threads counted them once each:
on a loaded runner a dozen of them, QEMU's, the models', the NBD backends', made every interval
read as stalled whole, and a plugin that slept 30 s passed DP-01 at load 9.)

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
    """When the watched threads waited for a CPU: disjoint intervals (`starts_ns`, `ends_ns`,
    host CLOCK_MONOTONIC, ascending), and the union of what every thread waited. `acting`: the
    same for the sampler's acting threads alone (the ones that run the system under test, e.g. a
    guest's virtual CPUs), where it was given some: the only waits that can delay what the system
    under test must do itself (a timer's wake, a poll after an answer)."""

    starts_ns: tuple[int, ...]
    ends_ns: tuple[int, ...]
    acting: WaitSeries | None = None

    def waited_between(self, start_ns: int, end_ns: int) -> int:
        """How long inside [start_ns, end_ns] of the host's clock some watched thread waited (ns)."""
        if end_ns <= start_ns:
            return 0
        first = bisect.bisect_right(self.ends_ns, start_ns)
        last = bisect.bisect_left(self.starts_ns, end_ns)
        return sum(max(0, min(self.ends_ns[i], end_ns) - max(self.starts_ns[i], start_ns))
                   for i in range(first, last))

    @property
    def total_ns(self) -> int:
        return sum(e - s for s, e in zip(self.starts_ns, self.ends_ns, strict=True))


class _Union:
    """Intervals that arrive with non-decreasing ends, kept merged (a long wait credited late
    swallows the shorter ones before it)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        while self.ends and self.ends[-1] >= start:
            start = min(start, self.starts.pop())
            end = max(end, self.ends.pop())
        self.starts.append(start)
        self.ends.append(end)


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
    sample on; an ended thread keeps what it had. `acting` (optional, asked at each rescan): which
    of those threads run the system under test; their waits are also kept apart (`.acting`)."""

    def __init__(self, threads: Callable[[], Iterable[tuple[int, int]]], period_s: float = PERIOD_S,
                 acting: Callable[[], Iterable[tuple[int, int]]] | None = None):
        self._threads = threads
        self._acting = acting
        self._acting_keys: set[tuple[int, int]] = set()
        self._period_s = period_s
        self._files: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, tid) -> (fd, last run delay)
        self._waits = _Union()
        self._acting_waits = _Union()
        self.samples = 0
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
        acting = None if self._acting is None else WaitSeries(tuple(self._acting_waits.starts),
                                                               tuple(self._acting_waits.ends))
        return WaitSeries(tuple(self._waits.starts), tuple(self._waits.ends), acting)

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
        if self._acting is not None:
            self._acting_keys = set(self._acting())
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
        now = time.monotonic_ns()
        credited, acting = [], []
        for key, (fd, last) in list(self._files.items()):
            delay = read_run_delay_ns(fd)
            if delay is None:  # ended: what it waited stays in the union
                os.close(fd)
                del self._files[key]
                continue
            if delay > last:
                credited.append(delay - last)
                if key in self._acting_keys:
                    acting.append(delay - last)
            self._files[key] = (fd, delay)
        for waits, union in ((credited, self._waits), (acting, self._acting_waits)):
            for waited in sorted(waits):  # each wait ended by now: it covered [now - waited, now]
                union.add(now - waited, now)
        self.samples += 1


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
