"""Mutant allocate_by_state_alone, breaks LIFE-03: a device whose error recovery is under way
is granted.

Plausible bug: allocate is bookkeeping on the health state alone: no look at the device of its
own (no config checkpoint) and no notion of an error recovery in progress. The health state
changes only once the kernel says how the recovery ended, so from the kernel's error line until
its outcome the device still reads HEALTHY, and an allocate that comes then is granted.
"""

from __future__ import annotations

import threading

from hilconform.runtime import procedures, service

from .launch import launch

_in_allocate = threading.local()


def apply() -> None:
    original_allocate = service.Service._m_allocate
    original_checkpoint = procedures.config_intact

    def available_by_health_alone(self) -> bool:
        return self.states.health == "HEALTHY" and not (
            self.isolated or self.leaving or self.gone or self.busy or self.resetting
        )

    def checkpoint_unless_allocating(sysfs, bdf, info):
        if getattr(_in_allocate, "active", False):
            return {"name": "config_intact", "ok": True, "problems": []}
        return original_checkpoint(sysfs, bdf, info)

    def allocate_without_looking(self, session, req):
        _in_allocate.active = True
        try:
            return original_allocate(self, session, req)
        finally:
            _in_allocate.active = False

    service.Device.available = available_by_health_alone
    procedures.config_intact = checkpoint_unless_allocating
    service.Service._m_allocate = allocate_without_looking


if __name__ == "__main__":
    launch("allocate_by_state_alone", apply)
