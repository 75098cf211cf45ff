"""Mutant double_allocation, breaks LIFE-03: a device already held is granted again.

Plausible bug: allocate by device treats a held device as allocatable ("allocation is
idempotent") and the lease index keeps only the latest grant, so two holders hold one
device at the same time.
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    original = service.Service._m_allocate

    def allocate_even_if_held(self, session, req):
        p = req.params
        if "device" not in p or p.get("count", 1) != 1:
            return original(self, session, req)
        holder = p.get("holder") or f"session-{session.id}"
        with self._lock:
            dev = self._lookup(p["device"])
            if dev.states.health not in ("HEALTHY", "ALLOCATED"):
                return original(self, session, req)  # the reference's refusal
            self.leases._by_device.pop(dev.bdf, None)  # the bug: the latest grant wins the index
            lease = self.leases.grant(holder, [dev.bdf], time.monotonic_ns(), p.get("ttl_s"))
            if dev.states.health == "HEALTHY":
                self._move_health(dev, "ALLOCATED", f"allocate:{lease.id}", {"name": "allocate", "ok": True})
            self.emit("lease", {**lease.to_dict(), "action": "granted"})
            return lease.to_dict()

    service.Service._m_allocate = allocate_even_if_held


if __name__ == "__main__":
    launch("double_allocation", apply)
