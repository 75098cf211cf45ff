"""Mutant release_skips_checkpoint, breaks LIFE-01: RELEASED -> HEALTHY at once on release,
under the release's own cause, without the release checkpoint.

Plausible bug: a runtime that hands a released device straight back to the pool (the
"fast path" of a busy scheduler) and never runs the release checkpoint (config_intact)
the way back to HEALTHY must pass; it emits RELEASED -> HEALTHY with the release's cause
(`release:L3`, `lease_expired`) and does not validate the move against its own table
(which lets only `release_checkpoint` take it).
"""

from __future__ import annotations

import time

from hilconform.runtime import service
from hilconform.runtime.lifecycle import Transition

from .launch import launch


def apply() -> None:
    original = service.Service._end_allocation

    def release_straight_back(self, dev, cause: str) -> None:
        if dev.isolated or dev.leaving or dev.gone or dev.states.health != "ALLOCATED":
            return original(self, dev, cause)
        self._move_health(dev, "RELEASED", cause, {"name": "release", "ok": True})
        move = Transition(dev.bdf, "health", "RELEASED", "HEALTHY", cause, {"name": "release", "ok": True},
                          time.monotonic_ns())
        dev.states.health = "HEALTHY"  # the bug: no checkpoint, no table check
        self._transition(dev, [move])

    service.Service._end_allocation = release_straight_back


if __name__ == "__main__":
    launch("release_skips_checkpoint", apply)
