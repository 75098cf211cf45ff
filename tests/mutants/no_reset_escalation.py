"""Mutant no_reset_escalation, breaks HP-03 (and RST-02): a drain timeout never escalates.

Plausible bug: the drain timeout is logged and the removal carries on to the power-off
without the forced reset, leaving a wedged device's queue to whatever the slot power-off
does to it.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    original = procedures.forced_reset

    def reset_unless_drain_timeout(host, run, source: str) -> dict:
        if source == "drain_timeout":
            return {"outcome": "not_attempted", "methods": [], "duration_ms": 0.0}
        return original(host, run, source)

    procedures.forced_reset = reset_unless_drain_timeout


if __name__ == "__main__":
    launch("no_reset_escalation", apply)
