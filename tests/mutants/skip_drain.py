"""Mutant skip_drain, breaks HP-02 (and HP-03): the removal never waits for the queue.

Plausible bug: a runtime that "drains" by marking the step done, on the belief that
isolation alone stops the work, so a request still in flight is cut off by the power-off.
Here: the drain reports `ok` at once without ever reading the queue depth.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    def drain_without_looking(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        return {"status": "ok", "depth": 0, "polls": 0, "elapsed_ms": 0.0}

    procedures.drain = drain_without_looking


if __name__ == "__main__":
    launch("skip_drain", apply)
