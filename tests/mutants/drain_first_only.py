"""Mutant drain_first_only, breaks HP-02: only the first orderly removal of a slot drains.

Plausible bug: a per-device cache of the drain's outcome, keyed on the BDF and never cleared
when the device leaves. The first removal of a slot drains correctly (the reference's drain:
polls until the queue is empty) and its result is kept; a device re-added into the same slot
gets the same BDF, and its later removal reports the cached result (`ok`, the first drain's
polls and elapsed time) at once, without looking at the queue: a read in flight on the new
device is cut off by the power-off. A test that removes each slot once never sees it.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    original = procedures.drain
    drained: dict[str, dict] = {}  # BDF -> the first drain's result

    def drain_cached_per_bdf(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        if bdf in drained:
            return dict(drained[bdf])
        result = original(hooks, sysfs, bdf, timeout_s, poll_s, gone)
        if result.get("status") == "ok":
            drained[bdf] = dict(result)
        return result

    procedures.drain = drain_cached_per_bdf


if __name__ == "__main__":
    launch("drain_first_only", apply)
