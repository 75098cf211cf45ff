"""Mutant storm_drops_events, breaks DISC-04: adds close behind another add are lost.

Plausible bug: a naive debounce. An add that arrives within the batch window of the
previous add is taken for a duplicate uevent and dropped, so in a storm only the first
device is discovered.
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    original = service.Service._on_change
    last_add_ns = [0]

    def on_change_debounced(self, change) -> None:
        if change.action == "add":
            now = time.monotonic_ns()
            recent = now - last_add_ns[0] < self.cfg.batch_window_ms * 1_000_000
            last_add_ns[0] = now
            if recent:
                return  # the bug: "a duplicate of the add we just handled"
        original(self, change)

    service.Service._on_change = on_change_debounced


if __name__ == "__main__":
    launch("storm_drops_events", apply)
