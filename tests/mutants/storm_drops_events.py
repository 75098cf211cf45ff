"""Mutant storm_drops_events, breaks DISC-04: in a storm only the first add is handled.

Plausible bug: the batch handler takes a batch's first add as "the" hot-plug and the
other adds of the same batch for echoes of it (udev often sends several events per
device), so in a storm of adds every device but the first goes undiscovered.
"""

from __future__ import annotations

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    original_change = service.Service._on_change
    original_batch = service.Service._on_batch
    batch = {"add_seen": False}  # the watcher thread calls both, one batch at a time

    def on_change_first_add_only(self, change) -> None:
        if change.action == "add":
            if batch["add_seen"]:
                return  # the bug: "an echo of the add this batch already has"
            batch["add_seen"] = True
        original_change(self, change)

    def on_batch_resets(self, changes) -> None:
        batch["add_seen"] = False
        original_batch(self, changes)

    service.Service._on_change = on_change_first_add_only
    service.Service._on_batch = on_batch_resets


if __name__ == "__main__":
    launch("storm_drops_events", apply)
