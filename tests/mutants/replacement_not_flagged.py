"""Mutant replacement_not_flagged, breaks DISC-05: after an orderly removal the slot's identity is
forgotten, so another unit put into the slot is taken for a first sighting and never flagged.

Plausible bug (the reference runtime had it until the clause was tightened): the removal
procedure clears the slot's identity record "because the device left on purpose", so a
replacement card is not reported as one.
"""

from __future__ import annotations

from hilconform.runtime import service
from hilconform.runtime.inventory import IdentityRegistry

from .launch import launch


def apply() -> None:
    remove_record = service.Service._remove_record

    def remove_and_forget(self, dev, cause: str) -> None:  # lock held
        remove_record(self, dev, cause)
        if dev.leaving:
            self.identities._seen.pop(IdentityRegistry.location(dev.info), None)

    service.Service._remove_record = remove_and_forget


if __name__ == "__main__":
    launch("replacement_not_flagged", apply)
