"""Mutant heals_when_errors_decay, breaks LIFE-05: a DEGRADED device heals on its own once its
error weight decays under degrade_weight (cause `aer:decayed`).

Plausible bug: "worse health wins" read as "the current evidence decides": the health poll
judges the decayed weight alone, and a device that its errors had degraded goes back to
HEALTHY when they fade, without the recovery operation. It does not validate the move
against its own table either (which lets only `recover` take DEGRADED -> HEALTHY).
"""

from __future__ import annotations

import time

from hilconform.runtime import service
from hilconform.runtime.lifecycle import Transition

from .launch import launch

CAUSE = "aer:decayed"


def heal_on_decay(heal) -> None:
    """After every health judgement: a device that its error weight degraded is handed to
    `heal(service, device, evidence)` once that weight fell under degrade_weight (lock held)."""
    original = service.Service._judge

    def judge(self, dev, checkpoint, cause, recovered=None):
        original(self, dev, checkpoint, cause, recovered)
        if dev.states.health != "DEGRADED" or dev.gone:
            dev.weighed_down = False
            return
        verdict = dev.aer.verdict(time.monotonic_ns())
        if verdict.weight >= dev.aer.policy.degrade_weight:
            dev.weighed_down = True  # degraded by its error weight
        elif getattr(dev, "weighed_down", False) and (checkpoint is None or checkpoint["ok"]):
            dev.weighed_down = False
            heal(self, dev, {"name": "health", "ok": True, "aer": {"weight": verdict.weight}})

    service.Service._judge = judge


def apply() -> None:
    def heal(self, dev, evidence: dict) -> None:
        move = Transition(dev.bdf, "health", "DEGRADED", "HEALTHY", CAUSE, evidence, time.monotonic_ns())
        dev.states.health = "HEALTHY"  # the bug: no table check
        self._transition(dev, [move])

    heal_on_decay(heal)


if __name__ == "__main__":
    launch("heals_when_errors_decay", apply)
