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
    finish_removal = service.Service.finish_removal

    def finish_and_forget(self, bdf: str, cause: str) -> None:
        dev = self.devices.get(bdf)
        finish_removal(self, bdf, cause)
        if dev is not None and dev.leaving:
            with self._lock:
                self.identities._seen.pop(IdentityRegistry.location(dev.info), None)

    service.Service.finish_removal = finish_and_forget


if __name__ == "__main__":
    launch("replacement_not_flagged", apply)
