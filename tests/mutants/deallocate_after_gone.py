"""Mutant deallocate_after_gone, breaks HP-01: holders hear DEALLOCATE only after the device left.

Plausible bug: the runtime revokes leases when it sees the device disappear (udev
remove / its own bookkeeping after the power-off) instead of as a step of the orderly
removal, so a holder keeps using a device that is already powered off.
"""

from __future__ import annotations

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    def no_deallocate_step(self, run, reason: str) -> list[dict]:
        return []  # the lease is revoked later, when the record is removed, once the device is gone

    service.Service.deallocate = no_deallocate_step


if __name__ == "__main__":
    launch("deallocate_after_gone", apply)
