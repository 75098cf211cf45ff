"""Mutant recovery_taken_as_failed, breaks AER-01: every AER recovery episode counts as failed.

Plausible bug: the runtime decides the outcome from the wrong uevent key (it reads the
episode's first DEVICE_ONLINE=0 instead of ERROR_EVENT), so a device the kernel recovered
from a non-fatal error is FAULTED as if recovery had failed.
"""

from __future__ import annotations

import dataclasses

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    original = service.Service._aer_uevent

    def outcome_always_failed(self, change) -> None:
        if change.properties.get("ERROR_EVENT") == "SUCCESSFUL_RECOVERY":
            properties = {**change.properties, "ERROR_EVENT": "FAILED_RECOVERY", "DEVICE_ONLINE": "0"}
            change = dataclasses.replace(change, properties=properties)
        original(self, change)

    service.Service._aer_uevent = outcome_always_failed


if __name__ == "__main__":
    launch("recovery_taken_as_failed", apply)
