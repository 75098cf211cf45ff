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
from hilconform.emulators.thread_wait import ThreadWaitSampler, WaitSeries, _Union, process_threads
from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.stall_witness import WaitedStalls

BUSY = "while True: pass"


def test_the_wait_inside_an_interval_is_the_part_of_the_wait_intervals_inside_it():
    series = WaitSeries(starts_ns=(150, 400), ends_ns=(200, 500))
    assert series.waited_between(100, 200) == 50
    assert series.waited_between(175, 450) == 75  # the end of one, the start of the other
    assert series.waited_between(-50, 1000) == 150
    assert series.waited_between(200, 400) == 0
    assert series.waited_between(200, 150) == 0
    assert WaitSeries((), ()).waited_between(0, 10) == 0


def test_waits_credited_at_once_or_later_are_merged_into_one_union():
    union = _Union()
    for start, end in [(90, 100), (80, 100), (95, 105), (200, 210), (150, 220)]:
        union.add(start, end)
    assert (union.starts, union.ends) == ([80, 150], [105, 220])


def test_the_guest_clock_is_mapped_with_its_drift_and_the_wait_is_at_most_the_interval():
    waits = WaitSeries(starts_ns=(1000,), ends_ns=(2000,))
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
    waited = busy_waits.waited_between(start, end) / 1e9
    assert 0.4 < waited < 2.0, f"a busy process sharing one CPU with two others waited {waited:.2f} s of 2 s"
    assert sleeper_waits.waited_between(start, end) < 5e6
    assert watched_busy.samples > 20  # sampled every few ms, not once


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
    assert list(waits.starts_ns) == sorted(waits.starts_ns) and all(
        s < e for s, e in zip(waits.starts_ns, waits.ends_ns, strict=True))
    assert waits.total_ns > 0.2e9


def test_threads_that_wait_at_once_count_once():
    """Three busy processes on one CPU: each waits about two thirds of the time, so their waits
    summed come to about twice the clock; watched together they count as the union, at most the
    clock."""
    busy = [_on_cpu0(BUSY) for _ in range(3)]
    try:
        each = [ThreadWaitSampler(lambda p=p: process_threads(p.pid)).start() for p in busy]
        together = ThreadWaitSampler(lambda: [t for p in busy for t in process_threads(p.pid)]).start()
        start = time.monotonic_ns()
        time.sleep(1.5)
        end = time.monotonic_ns()
        union, apart = together.stop(), [sampler.stop() for sampler in each]
    finally:
        for process in busy:
            process.kill()
            process.wait()
    elapsed = (end - start) / 1e9
    waited = union.waited_between(start, end) / 1e9
    summed = sum(w.waited_between(start, end) for w in apart) / 1e9
    assert 0.2 < waited <= elapsed, f"three busy processes waited {waited:.2f} s of {elapsed:.2f} s"
    assert summed > waited, f"summed {summed:.2f} s, union {waited:.2f} s of {elapsed:.2f} s"


def test_the_acting_threads_waits_are_kept_apart_and_a_sleeping_acting_thread_accrues_none():
    """Two busy processes and a sleeping one on one CPU, the sleeper named the acting thread (a
    guest's virtual CPU halted in a timer's sleep): the union of all waits grows, the acting
    thread's stays empty; a busy acting thread's waits are its own, within the union."""
    busy = [_on_cpu0(BUSY) for _ in range(2)]
    sleeper = _on_cpu0("import time; print('asleep', flush=True); time.sleep(60)")
    try:
        assert sleeper.stdout.readline().strip() == "asleep"
        everyone = lambda: [t for p in [*busy, sleeper] for t in process_threads(p.pid)]  # noqa: E731
        sleeping = ThreadWaitSampler(everyone, acting=lambda: process_threads(sleeper.pid)).start()
        working = ThreadWaitSampler(everyone, acting=lambda: process_threads(busy[0].pid)).start()
        start = time.monotonic_ns()
        time.sleep(1.0)
        end = time.monotonic_ns()
        asleep, awake = sleeping.stop(), working.stop()
    finally:
        for process in [*busy, sleeper]:
            process.kill()
            process.wait()
    assert asleep.waited_between(start, end) > 0.2e9
    assert asleep.acting is not None and asleep.acting.waited_between(start, end) < 0.02e9
    acting = awake.acting.waited_between(start, end)
    assert 0.1e9 < acting <= awake.waited_between(start, end)
    assert ThreadWaitSampler(everyone).start().stop().acting is None


def test_the_acting_stall_is_read_on_either_clock_and_a_witness_without_it_is_an_error():
    acting = WaitSeries(starts_ns=(1500,), ends_ns=(1600,))
    first = MonotonicOffset(offset_ns=1000, uncertainty_ns=0, guest_ns=0)
    stalls = WaitedStalls(WaitSeries((1000,), (2000,), acting), first, first)
    assert stalls.within_host_ms(1000, 2000) == pytest.approx(0.0001)  # the acting 100 ns
    assert stalls.within_host_ms(1000, 2000, acting=False) == pytest.approx(0.001)
    assert stalls.within_ms(0, 1000, acting=True) == pytest.approx(0.0001)  # guest clock: +1000 ns
    with pytest.raises(InfrastructureError):
        WaitedStalls(WaitSeries((1000,), (2000,)), first, first).within_host_ms(0, 10)
