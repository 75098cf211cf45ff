"""A guest's wall clock put back to the host's after the guest stood still.

Why: QEMU's virtual clock stops while a VM is paused (saved, restored, or a shared host held still
between its tests: `EmulatedVM.pause`). Afterwards the guest's monotonic clock and its boot time
agree with each other, as if no time had passed, but its wall clock is behind the host's by the
time it stood still. One agent command sets it; a command that ran late (a loaded machine) is
corrected by the offset measured after it.
"""

from __future__ import annotations

import time

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
