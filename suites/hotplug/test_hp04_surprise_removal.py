"""HP-04 removal without warning: allocations are revoked, the device is REMOVED, the
topology stays consistent with the ground truth, the runtime keeps serving.

Route: the device is taken away underneath the runtime with no announcement it can
see: the guest kernel powers the slot off (`echo 0 > /sys/bus/pci/slots/N/power`,
run through the guest agent, not through the runtime). No attention button, no
`remove` request, no kernel line the runtime follows: the runtime learns of it
only from the udev `remove` of a device that is already gone, then QEMU drops the
device (`DEVICE_DELETED`, ~1.1 s), so QEMU's bus tree is the ground truth again.

Why not `faults.remove_surprise` (ACPI host, the documented route): on an ACPI hot-plug
host QEMU's root ports (7.2 and 11.1 alike) report Data Link Layer Link Active = 0 with a
working device below them (lspci: `DLActive-`). A runtime that trusts the bit faults every
device at boot, and the allocation this clause must see revoked cannot exist there; the slot
power-off on a native host works whatever a runtime makes of the bit. (The reference reads the
bit only where the port advertises reporting: on an ACPI emulated:a100 its devices are HEALTHY
at boot.)
The device is allocated (and, for a queue stand-in, has reads running) when it goes.

Checked: the holder gets `deallocate` (reason `surprise`) for its lease, the lease is
`revoked` and no longer listed; the device moves to REMOVED and a `removed` event
(cause `surprise`) follows; `device` on it answers UNKNOWN_DEVICE; the last `topology`
event and the `inventory` both equal QEMU's own list of managed endpoints (query-pci);
`hello`, `inventory` and an allocate/release of another device still work.
"""

from __future__ import annotations

import pytest
from hotplug_support import (
    REMOVED_TIMEOUT_S,
    allocate,
    events_for,
    expected_managed,
    inventory_mismatch,
    pull_slot_power,
    settled_record,
    subscribe,
    wait_departed,
    watch_departures,
)

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.host_protocol import QueueFaults
from hilconform.fixtures.runtime_client import RuntimeCallError

pytestmark = [pytest.mark.clause("HP-04"), pytest.mark.destructive]


@pytest.mark.needs("qmp")
@pytest.mark.walks("health: ALLOCATED > REMOVED")
@pytest.mark.walks("main: ALLOCATED > POWER_OFF")
def test_surprise_removal_revokes_and_keeps_serving(host_factory):
    host = host_factory.fresh(hotplug_mode="native")
    runtime = host.runtime
    host.settled_inventory()
    slot = next(s for s in host.profile.slots if s.populated)
    bdf = host.target_bdf(slot.name)
    settled_record(host, bdf)
    lease = allocate(runtime, bdf, "hp04-holder")
    if "queue-stall" in host.capabilities:
        host.get(QueueFaults).start_reads(slot.name)  # work in flight when it goes (queue stand-ins)

    mark = subscribe(runtime)
    departures = watch_departures(host)
    pull_slot_power(host, bdf)
    if wait_departed(departures, bdf) is None:  # guest kernel + QEMU, not the runtime
        raise InfrastructureError(f"{bdf} did not leave the host after the guest powered its slot off")
    removed = runtime.wait_event("removed", mark, REMOVED_TIMEOUT_S,
                                 match=lambda d: d["device"] == bdf, what=f"removed {bdf}")
    assert removed["data"]["cause"] in ("surprise", "vanished"), removed["data"]

    deallocs = [e for e in events_for(runtime, mark, "deallocate", bdf)
                if e["data"]["lease"] == lease["lease"]]
    assert deallocs, f"holder of {lease['lease']} never got DEALLOCATE for {bdf}"
    assert deallocs[0]["data"]["holder"] == "hp04-holder"
    assert deallocs[0]["data"]["reason"] in ("surprise", "vanished"), deallocs[0]["data"]
    revoked = [e for e in runtime.events(mark, "lease")
               if e["data"].get("lease") == lease["lease"] and e["data"]["action"] == "revoked"]
    assert revoked, f"lease {lease['lease']} not revoked"
    held = [le for le in runtime.call("leases")["leases"] if bdf in le["devices"]]
    assert not held, f"{bdf} is gone but still leased: {held}"

    to_removed = [e for e in events_for(runtime, mark, "transition", bdf)
                  if e["data"]["view"] == "health" and e["data"]["to"] == "REMOVED"]
    assert to_removed, f"{bdf} never moved to REMOVED"
    assert deallocs[0]["seq"] <= removed["seq"] and to_removed[0]["seq"] <= removed["seq"]
    with pytest.raises(RuntimeCallError) as refused:
        runtime.call("device", {"device": bdf})
    assert refused.value.code == "UNKNOWN_DEVICE", refused.value

    truth = expected_managed(host)
    assert bdf not in truth, f"QEMU still lists {bdf} after the slot power-off"
    topologies = runtime.events(mark, "topology")
    assert topologies, "no topology event after the removal"
    assert set(topologies[-1]["data"]["devices"]) == truth, (
        f"last topology {topologies[-1]['data']['devices']} != QEMU's managed endpoints "
        f"{sorted(truth)}")
    mismatch = inventory_mismatch(host)
    assert mismatch is None, mismatch

    # the runtime keeps serving
    assert runtime.call("hello", {"client": "hp04"})["protocol"] == 1
    other = next((d["device"] for d in runtime.call("inventory")["devices"] if d["in_pool"]), None)
    assert other is not None, "no other device in the pool after the removal"
    lease2 = runtime.call("allocate", {"device": other, "holder": "hp04-after"})
    assert lease2["devices"] == [other]
    assert runtime.call("release", {"lease": lease2["lease"]})["released"] is True
    stats = runtime.call("stats")
    assert stats["internal_errors"] == 0, stats
    assert runtime.violations == []
