"""Mutant reset_without_budget, breaks RST-02: a forced reset waits for the device however long.

Plausible bug: the reset is written to sysfs and awaited in the calling thread (or with a
budget that is never checked), so a wedged card's reset that takes seconds ends "ok" and
the device goes on as if nothing happened instead of being FAULTED at reset_timeout_ms.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch

UNBOUNDED_WAIT_S = 120.0


def apply() -> None:
    original_wait = procedures.ResetWorker.wait

    def wait_without_budget(self, timeout_s: float) -> dict:
        return original_wait(self, UNBOUNDED_WAIT_S)

    procedures.ResetWorker.wait = wait_without_budget


if __name__ == "__main__":
    launch("reset_without_budget", apply)
