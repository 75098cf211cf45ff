"""Mutant never_faulted_by_errors, breaks LIFE-05: errors past fault_weight leave a device DEGRADED.

Plausible bug: the threshold ladder stops at its first rung (an elif that checks
degrade_weight before fault_weight), so a device whose error weight passed
fault_weight stays DEGRADED, never FAULTED.
"""

from __future__ import annotations

import dataclasses

from hilconform.runtime import aer

from .launch import launch


def apply() -> None:
    original = aer.DeviceAer.verdict

    def degraded_at_worst(self, now_ns: int, recovered: str | None = None) -> aer.Verdict:
        verdict = original(self, now_ns, recovered)
        if verdict.health == "FAULTED" and verdict.weight >= self.policy.fault_weight:
            return dataclasses.replace(verdict, health="DEGRADED")
        return verdict

    aer.DeviceAer.verdict = degraded_at_worst


if __name__ == "__main__":
    launch("never_faulted_by_errors", apply)
