"""Mutant drain_converted_twice, breaks HP-02 (and HP-03): the drain gives up a thousand times
too soon.

Plausible bug: the configured drain_timeout_ms converted to seconds twice (300 ms -> 0.3 ms), so
a healthy queue with one request in flight is declared stuck at the first look and the device
is force-reset. The mirror image of drain_timeout_3s.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    original = procedures.drain

    def drain_with_timeout_converted_twice(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        return original(hooks, sysfs, bdf, timeout_s / 1000, poll_s, gone)

    procedures.drain = drain_with_timeout_converted_twice


if __name__ == "__main__":
    launch("drain_converted_twice", apply)
