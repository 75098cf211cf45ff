"""Mutant handle_per_removal, breaks HP-06: every removed device leaves a file open in the runtime.

Plausible bug: the runtime keeps a handle on each device's config space (opened to read it
fast) in a cache keyed by the record, and the removal drops the record but never closes the
handle, so a node that sees many hot-plug cycles runs out of file descriptors.
"""

from __future__ import annotations

import os

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    original = service.Service._remove_record
    kept = []  # the forgotten handles

    def remove_keeping_a_handle(self, dev, cause: str) -> None:
        try:
            kept.append(open(f"/sys/bus/pci/devices/{dev.bdf}/config", "rb"))  # noqa: SIM115
        except OSError:  # already gone from sysfs: any handle leaks alike
            kept.append(open(os.devnull, "rb"))  # noqa: SIM115
        original(self, dev, cause)

    service.Service._remove_record = remove_keeping_a_handle


if __name__ == "__main__":
    launch("handle_per_removal", apply)
