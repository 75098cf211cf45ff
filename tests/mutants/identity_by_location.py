"""Mutant identity_by_location, breaks DISC-05: a device's identity is where it sits.

Plausible bug: the fingerprint is built from the slot and address only (the unit's
serial number / DSN never read, e.g. a runtime that trusts the topology), so another
card of the same model put into the same slot is taken for the old one: an identity
change in place is never flagged.
"""

from __future__ import annotations

import hashlib

from hilconform.runtime import inventory

from .launch import launch


def apply() -> None:
    def identity_by_location(info) -> tuple[str, str]:
        ids = f"{info.vendor_id:04x}:{info.device_id:04x}"
        value = f"{info.slot or ''}@{info.bdf}"
        return "location", hashlib.sha256(f"{ids}|location={value}".encode()).hexdigest()[:16]

    inventory._identity = identity_by_location


if __name__ == "__main__":
    launch("identity_by_location", apply)
