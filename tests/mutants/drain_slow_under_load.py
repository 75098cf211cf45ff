"""Mutant drain_slow_under_load, breaks HP-03: under CPU load the drain waits three times its timeout.

Plausible bug: a "load-aware" drain. Before it waits, it measures its own scheduling delay (it
spins for SPIN_MS reading the clock and counts the time lost in gaps over GAP_MS: the node ran
something else); where that is over LOADED of the spin (a busy node), it stretches its timeout
by FACTOR, so as not to reset a device that is merely slow under load, and polls without sleeping,
so as not to lose its turn. Measured in the a100 guest over a 100 ms spin: 0.0 idle (2 runs),
0.254, 0.266 (a100-stock) and 0.043 beside 3 CPU hogs on the 2-core runner (the host does not
always take the guest's turn: then it behaves as the reference, and nothing is wrong to catch).
A 200 ms spin at a fiftieth was tried and dropped: it lost 0.15 idle (not "only under load"),
and 200 ms spent between announcing the drain and starting its clock is itself caught (HP-03's
report lag: the host saw 512 ms from the announced start to the give-up). Idle it is the
reference runtime. Its deadline arithmetic is reported truly (`timeout_ms`, `deadline_ns` say
900 ms), plus `load_lost` (the fraction it lost).

What it exploits: a judgement that subtracts every node thread's waits over the whole drain from
the drain's length. A drain that busy-polls on a loaded node keeps the guest's virtual CPU
runnable, so it waits for a host CPU most of the 900 ms, and 900 ms less that came within the
450 ms window. HP-03 now judges the give-up on the runtime's own clock with no stall excuse.
"""

from __future__ import annotations

import time

from hilconform.runtime import procedures

from .launch import launch

SPIN_MS = 100
GAP_MS = 1.0  # a gap between two clock reads longer than this: the node ran something else
LOADED = 0.1  # lost more than this fraction of the spin: "the node is busy" (idle 0.0; 3 hogs 0.04-0.27)
FACTOR = 3


def lost_fraction(spin_ms: float = SPIN_MS, gap_ms: float = GAP_MS) -> float:
    """Spin for `spin_ms` reading the clock; the fraction of it lost in gaps over `gap_ms`."""
    start = last = time.monotonic_ns()
    end, gap, lost = start + int(spin_ms * 1e6), int(gap_ms * 1e6), 0
    while last < end:
        now = time.monotonic_ns()
        if now - last > gap:
            lost += now - last
        last = now
    return lost / max(1, last - start)


def apply() -> None:
    original = procedures.drain

    def drain_slow_under_load(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        lost = lost_fraction()
        if lost > LOADED:
            result = original(hooks, sysfs, bdf, timeout_s * FACTOR, 0.0, gone)
        else:
            result = original(hooks, sysfs, bdf, timeout_s, poll_s, gone)
        return {**result, "load_lost": round(lost, 3)}

    procedures.drain = drain_slow_under_load


if __name__ == "__main__":
    launch("drain_slow_under_load", apply)
