"""Mutant no_burst_filter, breaks AER-03: any counted error asks for a forced reset.

Plausible bug: the sustained-rate check compares the decaying weight against zero
instead of reset_weight, so a short burst of isolated, recovered errors resets the
device (the declared policy still says reset_weight).
"""

from __future__ import annotations

import dataclasses

from hilconform.runtime import aer

from .launch import launch


def apply() -> None:
    original = aer.DeviceAer.verdict

    def reset_on_any_weight(self, now_ns: int, recovered: str | None = None) -> aer.Verdict:
        verdict = original(self, now_ns, recovered)
        cooled = (self.last_reset_ns is None
                  or now_ns - self.last_reset_ns >= self.policy.reset_cooldown_s * 1e9)
        if verdict.weight > 0 and cooled and verdict.health != "FAULTED" and not verdict.reset:
            return dataclasses.replace(verdict, reset=True,
                                       reasons=(*verdict.reasons, "error weight > 0: sustained rate"))
        return verdict

    aer.DeviceAer.verdict = reset_on_any_weight


if __name__ == "__main__":
    launch("no_burst_filter", apply)
