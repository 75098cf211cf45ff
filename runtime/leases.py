"""Leases (LIFE-03, LIFE-04): who holds which devices until when.

Why a table of its own: "never two holders" is an invariant of one index
(device -> lease) that every grant checks, and expiry is a pure function of
the clock, so both are testable without sockets or sysfs. The caller (the
service) holds its lock around every call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


class LeaseError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Lease:
    id: str
    holder: str
    devices: list[str]
    ttl_ns: int
    granted_ns: int
    expires_ns: int
    renewals: int = 0
    revoked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "lease": self.id,
            "holder": self.holder,
            "devices": list(self.devices),
            "ttl_s": self.ttl_ns / 1e9,
            "granted_ns": self.granted_ns,
            "expires_ns": self.expires_ns,
            "renewals": self.renewals,
        }


class LeaseTable:
    def __init__(self, default_ttl_s: float, max_ttl_s: float = 24 * 3600.0):
        self.default_ttl_ns = int(default_ttl_s * 1e9)
        self.max_ttl_ns = int(max_ttl_s * 1e9)
        self._leases: dict[str, Lease] = {}
        self._by_device: dict[str, str] = {}
        self._ids = itertools.count(1)

    def _ttl_ns(self, ttl_s: float | None) -> int:
        if ttl_s is None:
            return self.default_ttl_ns
        if not 0 < ttl_s * 1e9 <= self.max_ttl_ns:
            raise LeaseError("INVALID_PARAMS", f"ttl_s must be > 0 and <= {self.max_ttl_ns / 1e9:g}")
        return int(ttl_s * 1e9)

    def holder_of(self, device: str) -> Lease | None:
        lease_id = self._by_device.get(device)
        return self._leases.get(lease_id) if lease_id else None

    def get(self, lease_id: str) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError("UNKNOWN_LEASE", f"no lease {lease_id!r}")
        return lease

    def grant(self, holder: str, devices: list[str], now_ns: int, ttl_s: float | None = None) -> Lease:
        if not devices or len(set(devices)) != len(devices):
            raise LeaseError("INVALID_PARAMS", "a lease needs distinct devices")
        ttl = self._ttl_ns(ttl_s)
        for dev in devices:
            if dev in self._by_device:
                raise LeaseError("DEVICE_BUSY", f"{dev} is held by lease {self._by_device[dev]}")
        lease = Lease(f"L{next(self._ids)}", holder, list(devices), ttl, now_ns, now_ns + ttl)
        self._leases[lease.id] = lease
        for dev in devices:
            self._by_device[dev] = lease.id
        return lease

    def renew(self, lease_id: str, now_ns: int, ttl_s: float | None = None) -> Lease:
        lease = self.get(lease_id)
        if ttl_s is not None:
            lease.ttl_ns = self._ttl_ns(ttl_s)
        lease.expires_ns = now_ns + lease.ttl_ns
        lease.renewals += 1
        return lease

    def release(self, lease_id: str) -> Lease:
        lease = self.get(lease_id)
        del self._leases[lease_id]
        for dev in lease.devices:
            self._by_device.pop(dev, None)
        return lease

    def revoke_device(self, device: str) -> Lease | None:
        """Take one device out of its lease (removal, fault); a lease left empty ends."""
        lease = self.holder_of(device)
        if lease is None:
            return None
        lease.devices.remove(device)
        lease.revoked.append(device)
        self._by_device.pop(device, None)
        if not lease.devices:
            self._leases.pop(lease.id, None)
        return lease

    def expired(self, now_ns: int) -> list[Lease]:
        """Remove and return every lease whose TTL ran out."""
        gone = [lease for lease in self._leases.values() if lease.expires_ns <= now_ns]
        for lease in gone:
            self.release(lease.id)
        return gone

    def all(self) -> list[Lease]:
        return list(self._leases.values())

    def check_invariants(self) -> None:
        """Assert the index and the leases agree (used by tests and the stats method)."""
        seen: dict[str, str] = {}
        for lease in self._leases.values():
            for dev in lease.devices:
                assert dev not in seen, f"{dev} held by {seen[dev]} and {lease.id}"
                seen[dev] = lease.id
        assert seen == self._by_device, "device index out of step with leases"
