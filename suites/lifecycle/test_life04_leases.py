"""LIFE-04: an allocation not renewed within its TTL is released; a renewed one is kept.

Runs on the shared host, whose runtime gets the profile's shortened TTL (`[budgets]
lease_ttl_s`, written into the runtime config by the emulated host; the runtime's
`hello` must report it). Several leases are granted without a TTL of their own (so the
configured default applies) and never renewed; one more lease is renewed every TTL/4.

* Expiry: each unrenewed lease gets an `expired` lease event, its holder a `deallocate`
  (reason lease_expired), and its device goes ALLOCATED -> RELEASED -> HEALTHY.
  Measured on the host (`time.monotonic_ns()`): allocate sent -> `expired` event
  received, per lease, in ms; budget: every sample (max) <= lease_ttl_s * 1000 +
  lease_expiry_tolerance_ms.
  A lease must never expire early: on the runtime's clock, the `expired` event's ts_ns
  - the lease's granted_ns >= TTL.
* Renewal: the renewed lease is still held (and its device ALLOCATED) after 1.5 TTL,
  with no expiry and no deallocate; the expired ones are gone (renew -> UNKNOWN_LEASE).
"""

from __future__ import annotations

import time

import pytest
from lifecycle_support import (
    allocate,
    flush,
    free_devices,
    health_moves,
    refused,
    subscribe_live,
    wait_state,
)

from hilconform.fixtures.runtime_client import RuntimeUnresponsive

pytestmark = pytest.mark.clause("LIFE-04")

EXPIRING_LEASES = 3
RENEWED_FOR_TTLS = 1.5
DEFAULT_TOLERANCE_MS = 1000.0  # when a profile has no lease_expiry_tolerance_ms


def test_unrenewed_lease_expires_at_its_ttl_and_a_renewed_one_is_kept(host, measurements):
    runtime = host.runtime
    checker, mark = subscribe_live(runtime)
    ttl_s = float(runtime.hello["config"]["lease_ttl_s"])
    budgets = host.profile.budgets
    if "lease_ttl_s" in budgets:
        assert ttl_s == budgets["lease_ttl_s"], (
            f"the runtime reports lease_ttl_s {ttl_s}, the profile configured {budgets['lease_ttl_s']}")
    tolerance_ms = budgets.get("lease_expiry_tolerance_ms", DEFAULT_TOLERANCE_MS)
    free = free_devices(host, runtime, needed=2)
    assert len(free) >= 2, f"need two free devices on the shared host, have {free}"
    expiring_devices, kept_device = free[:-1][:EXPIRING_LEASES], free[-1]

    sent_ns: dict[str, int] = {}
    leases: dict[str, dict] = {}
    for i, bdf in enumerate(expiring_devices):
        before = time.monotonic_ns()
        lease = allocate(runtime, device=bdf, holder=f"life04-idle-{i}")
        sent_ns[lease["lease"]], leases[lease["lease"]] = before, lease
    kept = allocate(runtime, device=kept_device, holder="life04-renewing")
    ttls = [x["ttl_s"] for x in [*leases.values(), kept]]
    assert all(abs(t - ttl_s) < 1e-6 for t in ttls), f"lease TTLs {ttls}, configured default {ttl_s}"

    # Renew every TTL/4 until 1.5 TTL have passed; a lost lease ends the wait at once.
    lost = {"renewed lease lost": None}
    kept_until = time.monotonic() + RENEWED_FOR_TTLS * ttl_s
    renewals = 0
    try:
        while time.monotonic() < kept_until:
            step = min(ttl_s / 4, max(0.0, kept_until - time.monotonic()))
            try:
                lost["renewed lease lost"] = runtime.wait_event(
                    "lease", mark, step, match=lambda d: d["lease"] == kept["lease"]
                    and d["action"] in ("expired", "revoked", "released"))
                break
            except RuntimeUnresponsive:
                runtime.call("renew", {"lease": kept["lease"]})
                renewals += 1
        assert lost["renewed lease lost"] is None, (
            f"lease {kept['lease']} was renewed every {ttl_s / 4:.2f}s but ended: "
            f"{lost['renewed lease lost']['data']}")
        current = {x["lease"]: x for x in runtime.call("leases")["leases"]}
        assert kept["lease"] in current and current[kept["lease"]]["devices"] == [kept_device], current
        assert runtime.call("device", {"device": kept_device})["state"] == "ALLOCATED"
        assert renewals >= 4, f"only {renewals} renewals in {RENEWED_FOR_TTLS} TTL"

        expired = {}
        for lease_id in leases:
            expired[lease_id] = runtime.wait_event(
                "lease", mark, ttl_s + tolerance_ms / 1000 + 10,
                match=lambda d, lease_id=lease_id: d["lease"] == lease_id and d["action"] == "expired",
                what=f"expiry of unrenewed lease {lease_id}")
    finally:
        refused(lambda: runtime.call("release", {"lease": kept["lease"]}))
    for lease in leases.values():
        wait_state(runtime, lease["devices"][0], {"HEALTHY"})
    wait_state(runtime, kept_device, {"HEALTHY"})

    millis = [(expired[x]["host_ns"] - sent_ns[x]) / 1e6 for x in leases]
    summary = measurements.record("LIFE-04", "lease_expiry", millis, unit="ms",
                                  budget=ttl_s * 1000 + tolerance_ms, budget_stat="max")
    # the runtime's own lateness (its clock: expired event - the lease's expires_ns), for diagnosis
    measurements.record("LIFE-04", "lease_expiry_lateness_runtime",
                        [(expired[x]["ts_ns"] - leases[x]["expires_ns"]) / 1e6 for x in leases], unit="ms")
    early = {x: (expired[x]["ts_ns"] - leases[x]["granted_ns"]) / 1e9 for x in leases
             if expired[x]["ts_ns"] - leases[x]["granted_ns"] < ttl_s * 1e9}
    assert not early, f"leases expired before their TTL of {ttl_s}s (runtime clock): {early}"
    assert summary.within_budget, summary.text()

    flush(runtime)
    deallocated = {e["data"]["lease"]: e["data"] for e in runtime.events(mark, "deallocate")}
    for lease_id, lease in leases.items():
        note = deallocated.get(lease_id)
        assert note and note["reason"] == "lease_expired" and note["holder"] == lease["holder"], (
            f"holder of {lease_id} got no deallocate(lease_expired): {note}")
        moves = health_moves(runtime, mark, lease["devices"][0])
        assert moves[-3:] == [("HEALTHY", "ALLOCATED"), ("ALLOCATED", "RELEASED"), ("RELEASED", "HEALTHY")], (
            f"{lease['devices'][0]}: {moves}")
        gone = refused(lambda lease_id=lease_id: runtime.call("renew", {"lease": lease_id}))
        assert gone is not None and gone.code == "UNKNOWN_LEASE", f"renew of expired {lease_id}: {gone!r}"
    assert kept["lease"] not in deallocated, f"renewed lease deallocated: {deallocated.get(kept['lease'])}"
    checker.feed_all(runtime.events(mark))
    checker.assert_clean()
