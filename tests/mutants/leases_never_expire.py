"""Mutant leases_never_expire, breaks LIFE-04: an unrenewed lease is kept forever.

Plausible bug: the expiry sweep exists but never finds anything (e.g. compares a
monotonic deadline against wall-clock time), so a crashed holder keeps its devices.
"""

from __future__ import annotations

from hilconform.runtime import leases

from .launch import launch


def apply() -> None:
    def nothing_expires(self, now_ns: int) -> list:
        return []

    leases.LeaseTable.expired = nothing_expires


if __name__ == "__main__":
    launch("leases_never_expire", apply)
