"""Mutant illegal_transition, breaks LIFE-01 (and LIFE-03): release jumps ALLOCATED -> HEALTHY.

Plausible bug: a runtime that does not validate its moves against its own published
table and "optimises" the release path by skipping RELEASED (and its checkpoint).
"""

from __future__ import annotations

import time

from hilconform.runtime import service
from hilconform.runtime.lifecycle import Transition

from .launch import launch


def apply() -> None:
    original = service.Service._end_allocation

    def release_straight_to_healthy(self, dev, cause: str) -> None:
        if dev.isolated or dev.leaving or dev.gone or dev.states.health != "ALLOCATED":
            return original(self, dev, cause)
        move = Transition(dev.bdf, "health", "ALLOCATED", "HEALTHY", cause,
                          {"name": "release", "ok": True}, time.monotonic_ns())
        dev.states.health = "HEALTHY"  # the bug: no table check, no RELEASED
        self._transition(dev, [move])

    service.Service._end_allocation = release_straight_to_healthy


if __name__ == "__main__":
    launch("illegal_transition", apply)
