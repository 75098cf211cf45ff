"""Mutant late_renewals_dropped, breaks LIFE-04: a renewal in the last second before the deadline is
answered but not applied, so the lease still expires at its old deadline.

Plausible bug: the renewal path skips leases "about to expire anyway" (a grace check written the
wrong way round), so a holder that renews late, as a busy one does, loses its devices.
"""

from __future__ import annotations

from hilconform.runtime import leases

from .launch import launch

LATE_NS = 1_000_000_000


def apply() -> None:
    renew = leases.LeaseTable.renew

    def renew_unless_late(self, lease_id, now_ns, *args, **kwargs):
        lease = self.get(lease_id)
        if lease.expires_ns - now_ns < LATE_NS:
            return lease  # "too late to bother": the deadline stays where it was
        return renew(self, lease_id, now_ns, *args, **kwargs)

    leases.LeaseTable.renew = renew_unless_late


if __name__ == "__main__":
    launch("late_renewals_dropped", apply)
