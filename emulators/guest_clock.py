"""A guest's wall clock put back to the host's after the guest stood still.

Why: QEMU's virtual clock stops while a VM is paused (saved, restored, or a shared host held still
between its tests: `EmulatedVM.pause`). Afterwards the guest's monotonic clock and its boot time
agree with each other, as if no time had passed, but its wall clock is behind the host's by the
time it stood still. One agent command sets it; a command that ran late (a loaded machine) is
corrected by the offset measured after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .errors import InfrastructureError

STEP_S = 0.2  # a guest's wall clock further off than this after the set is stepped by the offset
OFF_LIMIT_S = 1.0  # and further off than this after the step is an error


def set_wall_clock(vm, what: str, also: str = "") -> None:
    """Set `vm`'s guest wall clock to the host's, running the shell command `also` in the same
    agent command (one round trip); `what` names the guest in an error."""
    script = f"date -s @{time.time_ns() / 1e9:.6f} >/dev/null"
    if also:
        script += f" && {also}"
    result = vm.agent.shell(script, timeout_s=20)
    if result.exit_code != 0:
        raise InfrastructureError(f"{what}: could not set its clock{' or run ' + also if also else ''}: "
                                  f"{result.stderr.strip()}")
    off_s = offset_s(vm)
    if abs(off_s) > STEP_S:  # the command ran late (a loaded machine): step it by what it lost
        step = vm.agent.shell(f"n=$(( $(date +%s%N) + {int(-off_s * 1e9)} )); "
                              'date -s "@$((n / 1000000000)).$(printf %09d $((n % 1000000000)))" >/dev/null',
                              timeout_s=20)
        off_s = offset_s(vm)
        if step.exit_code != 0 or abs(off_s) > OFF_LIMIT_S:
            raise InfrastructureError(f"{what}: its clock is {abs(off_s):.1f} s off the host's "
                                      f"{step.stderr.strip()}")


def offset_s(vm) -> float:
    """The guest's wall clock less the host's, taken at the middle of the agent's round trip."""
    before = time.time_ns()
    guest_ns = vm.agent.call("guest-get-time")
    return (guest_ns - (before + time.time_ns()) / 2) / 1e9


@dataclass(frozen=True)
class MonotonicOffset:
    """The host's CLOCK_MONOTONIC less the guest's (ns), at the guest's monotonic `guest_ns`, known
    to within `uncertainty_ns` (half the agent's round trip it was read in)."""

    offset_ns: int
    uncertainty_ns: int
    guest_ns: int


def monotonic_offset(vm, tries: int = 5) -> MonotonicOffset:
    """How far the guest's monotonic clock (the runtime's `ts_ns`) is behind the host's.

    Why: host-side measures of the guest (emulators/thread_wait.py) are taken on the host's clock,
    a runtime's events on the guest's; the two differ by the time the guest stood still (a saved
    VM, a paused one) and drift apart slowly (the guest's clock source, calibrated under TCG). The
    agent reads only the guest's wall clock, so one guest command first takes the guest's wall
    clock less its monotonic one (no step between it and the reads: nothing steps the clock of a
    running guest but `set_wall_clock`); then the agent's reads with the shortest round trip of
    `tries` give the offset."""
    probe = vm.agent.shell("python3 -c 'import time; a = time.monotonic_ns(); b = time.time_ns(); "
                           "c = time.monotonic_ns(); print(a, b, c)'", timeout_s=30)
    fields = probe.stdout.split()
    if probe.exit_code != 0 or len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise InfrastructureError(f"could not read the guest's clocks: {probe.stdout!r} {probe.stderr!r}")
    mono_a, wall, mono_c = (int(f) for f in fields)
    wall_less_monotonic = wall - (mono_a + mono_c) // 2
    best = None
    for _ in range(tries):
        before = time.monotonic_ns()
        guest_wall = vm.agent.call("guest-get-time")
        after = time.monotonic_ns()
        guest_monotonic = guest_wall - wall_less_monotonic
        reading = MonotonicOffset((before + after) // 2 - guest_monotonic, (after - before) // 2,
                                  guest_monotonic)
        if best is None or reading.uncertainty_ns < best.uncertainty_ns:
            best = reading
    return best
