"""Mutant drain_forever, breaks HP-03: the drain waits for the queue however long it takes.

Plausible bug: a drain loop written as "poll until the queue is empty" with no deadline,
so a stuck device holds the removal until the hardware answers (or forever), and no
forced reset ever happens.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    original = procedures.drain

    def drain_without_deadline(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        return original(hooks, sysfs, bdf, float("inf"), poll_s, gone)

    procedures.drain = drain_without_deadline


if __name__ == "__main__":
    launch("drain_forever", apply)
