"""LIFE-01: the edges of the transition table that no other clause's test makes the runtime
walk, each walked on a real device by a fault, with the recovery after it.

Why: docs/edge-coverage.md (reports/edge_coverage.py) lists every edge of the table the runtime
publishes with the tests that walk it; these moves had none. A runtime that gets one of them
wrong (keeps a degraded or faulted device held, heals it by itself, leaves it out of the pool
after `recover`, keeps a removed one) passes every test that never takes that way. Each test's
`walks` markers are proven at its end by the walk check (fixtures/walks_check.py): the runtime
must make exactly those consecutive moves on one device in the test's window.

The policy makes each error's effect certain: a recovered non-fatal error leaves the device
DEGRADED, a fatal one FAULTED, the weight thresholds out of reach (LIFE-05 checks them).
A fresh host each (destructive: devices are degraded, faulted and removed).

* A held device that degrades: its lease is revoked (ALLOCATED -> DEGRADED, DEALLOCATE to the
  holder; the holder's late release neither heals nor re-holds it), `recover` heals it (the way
  back after that way in), a later error degrades it again and its orderly removal takes it from
  DEGRADED to REMOVED; an idle HEALTHY device's orderly removal takes it HEALTHY -> REMOVED.
* A held device that faults, once while its holder uses it (renewed: main RUNNING) and once just
  granted (main ALLOCATED): each time its lease is revoked; `recover` after the first brings it
  back (FAULTED -> HEALTHY, main ERROR -> INITIALIZED); after the second it is removed FAULTED.
* An idle device faulted from DEGRADED, then from HEALTHY: `recover` brings it back each time.

A fatal error's link reset clears the device's BARs where no bound driver's `slot_reset` restores
them (vfio-pci on the a100 models; nvme on the stock hosts restores them): `recover` must bring
the device back either way (the reference runtime writes the kernel's assigned BARs back, its
`config_restore` step).
"""

from __future__ import annotations

import pytest
from lifecycle_support import (
    PROCEDURE_TIMEOUT_S,
    allocate,
    device_record,
    inject_nonfatal,
    refused,
    remove_and_wait_gone,
    require_aer_recovery,
    runtime_config,
    settled_inventory,
    slot_of,
    wait_state,
)

pytestmark = [pytest.mark.clause("LIFE-01"), pytest.mark.destructive, pytest.mark.slow]

POLICY = {"aer": {"nonfatal_recovered": "DEGRADED", "fatal_recovered": "FAULTED", "degrade_weight": 1000.0,
                  "fault_weight": 1000.0, "reset_weight": 1000.0}}
REMOVAL_TIMEOUT_S = 20.0


def _fresh(host_factory):
    host = host_factory.fresh(runtime_config=runtime_config(host_factory, POLICY))
    return host, host.runtime, settled_inventory(host.runtime)["devices"]


def _revoked(runtime, mark: int, lease: dict, bdf: str) -> None:
    """The holder got DEALLOCATE for its lease, and the lease is no longer listed."""
    runtime.wait_event("deallocate", mark, PROCEDURE_TIMEOUT_S, what=f"DEALLOCATE of {lease['lease']}",
                       match=lambda d: d["lease"] == lease["lease"] and d["device"] == bdf)
    assert lease["lease"] not in {x["lease"] for x in runtime.call("leases")["leases"]}, (
        f"{bdf} left ALLOCATED but lease {lease['lease']} is still listed")


def _recover(runtime, bdf: str) -> None:
    result = runtime.call("recover", {"device": bdf}, timeout_s=PROCEDURE_TIMEOUT_S)
    assert result["recovered"] is True, f"recover of {bdf}: {result}"
    assert wait_state(runtime, bdf, {"HEALTHY"})["in_pool"] is True


@pytest.mark.needs("aer-nonfatal", "orderly-removal")
@pytest.mark.walks("health: HEALTHY > ALLOCATED > DEGRADED > HEALTHY@recover > DEGRADED > REMOVED")
@pytest.mark.walks("main: INITIALIZED > ALLOCATED > INITIALIZED > POWER_OFF")
@pytest.mark.walks("health: HEALTHY > REMOVED")
def test_a_held_device_that_degrades_is_revoked_recovers_and_leaves_degraded(host_factory):
    host, runtime, boot = _fresh(host_factory)
    target = next((d for d in boot if d["info"].get("driver") is not None), boot[0])
    require_aer_recovery(target)
    bdf, slot = target["device"], slot_of(host, target["device"])
    idle = next(d["device"] for d in boot if d["device"] != bdf)

    mark = runtime.mark()
    lease = allocate(runtime, device=bdf, holder="life01-edges", ttl_s=60)
    inject_nonfatal(host, slot, bdf)
    assert wait_state(runtime, bdf, {"DEGRADED"})["lease"] is None
    _revoked(runtime, mark, lease, bdf)
    # The holder's release after the error (it may not have read its DEALLOCATE yet): refused or a
    # no-op, never a way back to the pool: only `recover` heals a DEGRADED device.
    refused(lambda: runtime.call("release", {"lease": lease["lease"]}))
    record = device_record(runtime, bdf)
    assert (record["state"], record["lease"]) == ("DEGRADED", None), f"after the late release: {record}"
    _recover(runtime, bdf)

    inject_nonfatal(host, slot, bdf)
    wait_state(runtime, bdf, {"DEGRADED"})
    remove_and_wait_gone(host, runtime, bdf, REMOVAL_TIMEOUT_S)
    remove_and_wait_gone(host, runtime, idle, REMOVAL_TIMEOUT_S)
    listed = {d["device"] for d in runtime.call("inventory")["devices"]}
    assert not listed & {bdf, idle}, f"removed devices still listed: {sorted(listed & {bdf, idle})}"


@pytest.mark.needs("aer-fatal", "orderly-removal")
@pytest.mark.walks("health: HEALTHY > ALLOCATED > FAULTED > HEALTHY@recover > ALLOCATED > FAULTED > REMOVED")
@pytest.mark.walks("main: INITIALIZED > ALLOCATED > RUNNING > ERROR > INITIALIZED > ALLOCATED > ERROR "
                   "> POWER_OFF")
def test_a_held_device_that_faults_is_revoked_recovers_and_leaves_faulted(host_factory):
    host, runtime, _boot = _fresh(host_factory)
    slot = host.targets("aer-fatal")[0]
    bdf = host.target_bdf(slot)
    wait_state(runtime, bdf, {"HEALTHY"})

    mark = runtime.mark()
    used = allocate(runtime, device=bdf, holder="life01-edges-used", ttl_s=60)
    runtime.call("renew", {"lease": used["lease"]})  # the holder uses it: main RUNNING
    host.get("aer-fatal").aer_fatal(slot, wait_recovery=True)
    assert wait_state(runtime, bdf, {"FAULTED"})["lease"] is None
    _revoked(runtime, mark, used, bdf)
    _recover(runtime, bdf)

    mark = runtime.mark()
    fresh = allocate(runtime, device=bdf, holder="life01-edges-granted", ttl_s=60)
    host.get("aer-fatal").aer_fatal(slot, wait_recovery=True)
    assert wait_state(runtime, bdf, {"FAULTED"})["lease"] is None
    _revoked(runtime, mark, fresh, bdf)
    mark = runtime.mark()
    host.get("orderly-removal").remove(slot)
    runtime.wait_event("removed", mark, REMOVAL_TIMEOUT_S, match=lambda d: d["device"] == bdf,
                       what=f"removal of the FAULTED {bdf}")


@pytest.mark.needs("aer-fatal", "aer-nonfatal")
@pytest.mark.walks("health: HEALTHY > DEGRADED > FAULTED > HEALTHY@recover > FAULTED > HEALTHY@recover")
@pytest.mark.walks("main: INITIALIZED > ERROR > INITIALIZED > ERROR > INITIALIZED")
def test_a_device_faulted_from_degraded_and_from_healthy_recovers_each_time(host_factory):
    host, runtime, _boot = _fresh(host_factory)
    slot = host.targets("aer-fatal")[0]
    bdf = host.target_bdf(slot)
    require_aer_recovery(wait_state(runtime, bdf, {"HEALTHY"}))

    inject_nonfatal(host, slot, bdf)
    wait_state(runtime, bdf, {"DEGRADED"})
    host.get("aer-fatal").aer_fatal(slot, wait_recovery=True)
    wait_state(runtime, bdf, {"FAULTED"})  # worse wins: DEGRADED -> FAULTED
    _recover(runtime, bdf)

    host.get("aer-fatal").aer_fatal(slot, wait_recovery=True)
    wait_state(runtime, bdf, {"FAULTED"})
    _recover(runtime, bdf)
