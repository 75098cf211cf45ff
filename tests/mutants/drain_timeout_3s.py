"""Mutant drain_timeout_3s, breaks HP-03: the drain gives up after 3 s, not 300 ms.

Plausible bug: the timeout read in the wrong unit or a hard-coded "generous" value
(3000 ms instead of the configured drain_timeout_ms = 300), so a stuck queue holds the
removal ten times too long before the forced reset.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch

DRAIN_TIMEOUT_S = 3.0


def apply() -> None:
    original = procedures.drain

    def drain_with_3s_timeout(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        return original(hooks, sysfs, bdf, DRAIN_TIMEOUT_S, poll_s, gone)

    procedures.drain = drain_with_3s_timeout


if __name__ == "__main__":
    launch("drain_timeout_3s", apply)
