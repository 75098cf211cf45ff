"""The host-side witness of an emulated guest's stalls: emulators/thread_wait.py (the kernel's run
delay of chosen threads, sampled) and fixtures/stall_witness.py's WaitedStalls (read on the guest's
clock). The sampler is run against real processes that compete for one CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hilconform.emulators.guest_clock import MonotonicOffset
from hilconform.emulators.thread_wait import ThreadWaitSampler, WaitSeries, process_threads
from hilconform.fixtures.stall_witness import WaitedStalls

BUSY = "while True: pass"


def test_the_wait_inside_an_interval_is_read_between_the_samples_around_its_ends():
    series = WaitSeries(at_ns=(0, 100, 200, 300), waited_ns=(0, 0, 50, 50))
    assert series.waited_between(100, 200) == 50
    assert series.waited_between(150, 300) == 25  # half of the 100-200 sample's wait
    assert series.waited_between(-50, 1000) == 50  # outside the samples: their first and last sums
    assert series.waited_between(200, 150) == 0
    assert WaitSeries((), ()).waited_between(0, 10) == 0


def test_the_guest_clock_is_mapped_with_its_drift_and_the_wait_is_at_most_the_interval():
    waits = WaitSeries(at_ns=(1000, 2000, 3000), waited_ns=(0, 1000, 1000))
    first = MonotonicOffset(offset_ns=1000, uncertainty_ns=0, guest_ns=0)
    last = MonotonicOffset(offset_ns=1100, uncertainty_ns=0, guest_ns=1000)  # the guest ran 10% slow
    stalls = WaitedStalls(waits, first, last)
    assert stalls.to_host_ns(0) == 1000
    assert stalls.to_host_ns(500) == 1550
    assert stalls.to_host_ns(1000) == 2100
    assert stalls.within_ms(0, 1000) == pytest.approx(0.001)  # 1000 ns of wait in [1000, 2100] ns
    assert stalls.within_ms(0, 500) == pytest.approx(0.0005)  # 550 ns of wait, clipped to the interval


def _on_cpu0(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: os.sched_setaffinity(0, {0}),
                            stdout=subprocess.PIPE, text=True)


def test_a_thread_that_shares_its_cpu_waits_and_one_that_sleeps_does_not():
    """Three busy processes on one CPU: each waits about two thirds of the time; a sleeping one none.
    (Run beside other load at a lower priority, e.g. `nice -n 19` under CPU hogs, they may hardly
    get the CPU at all, and their waits are counted only once they do.)"""
    busy = [_on_cpu0(BUSY) for _ in range(3)]
    sleeper = _on_cpu0("import time; print('asleep', flush=True); time.sleep(60)")
    try:
        assert sleeper.stdout.readline().strip() == "asleep"  # its start-up's waits are behind it
        watched_busy = ThreadWaitSampler(lambda: process_threads(busy[0].pid)).start()
        watched_sleeper = ThreadWaitSampler(lambda: process_threads(sleeper.pid)).start()
        start = time.monotonic_ns()
        time.sleep(2.0)
        end = time.monotonic_ns()
        busy_waits, sleeper_waits = watched_busy.stop(), watched_sleeper.stop()
    finally:
        for process in busy + [sleeper]:
            process.kill()
            process.wait()
    # The kernel counts a wait when the thread gets the CPU back: read up to the last sample.
    waited = busy_waits.waited_between(start, busy_waits.at_ns[-1]) / 1e9
    assert 0.4 < waited < 2.0, f"a busy process sharing one CPU with two others waited {waited:.2f} s of 2 s"
    assert sleeper_waits.waited_between(start, end) < 5e6
    assert len(busy_waits.at_ns) > 20  # sampled every few ms, not once


def test_a_thread_that_ends_keeps_what_it_waited_and_a_new_one_counts_from_its_first_sample():
    busy = [_on_cpu0(BUSY) for _ in range(2)]
    watched = list(busy)
    sampler = ThreadWaitSampler(lambda: [t for p in watched for t in process_threads(p.pid)]).start()
    try:
        time.sleep(0.5)
        busy[0].kill()
        busy[0].wait()
        late = _on_cpu0(BUSY)
        watched.append(late)
        time.sleep(0.6)
    finally:
        for process in busy[1:]:
            process.kill()
            process.wait()
        waits = sampler.stop()
        late.kill()
        late.wait()
    assert waits.waited_ns == tuple(sorted(waits.waited_ns))  # a running sum never goes back
    assert waits.waited_ns[-1] > 0.2e9
