"""DP-04 return: a device that comes back (here: removed through the slot's attention button,
then the same unit re-added to its slot) is Healthy again within `dp_return_ms`, under the same
ID, without a plugin restart. (Orderly, not surprise removal, where the host offers it: QEMU
11.1's ACPI hot-plug cannot re-assign a device model's 256 MiB BAR in a slot it was removed
from, "BAR 1 failed to assign"; native pciehp can, on both device kinds. A host without orderly
removal, a real one, removes the device without warning (sysfs) and a rescan brings it back.)

Measured on the node's clock: the kernel's `add` uevent of the re-added device (an independent
`udevadm monitor`) to the stand-in's record of the ListAndWatch message listing every ID it had
before the loss Healthy again.

Which IDs are the removed device's is what the plugin itself says (fixtures/plugin_ties.py:
Allocate's device nodes, environment, CDI names, topology, asked before the removal): the loss
awaited is exactly those IDs gone or Unhealthy, the others Healthy (DP-03's judge); back, the
same IDs are Healthy again and the plugin's Allocate ties them to the device in the slot again
(the same unit under the same ID, not an ID moved onto another device).
"""

from __future__ import annotations

import pytest
from dp_support import (
    LostDevice,
    advertised,
    answer_window_s,
    await_departure,
    budget,
    fresh_host,
    healthy_ids,
    kernel_event_ms,
    kubelet_with_plugin,
    latest_list,
    listed_healthy,
    ms_after,
    named,
    plugin_ties,
    resource_of,
    topologies,
    wait_list,
)

from hilconform.fixtures.uevent_witness import GuestUeventWitness

pytestmark = [pytest.mark.clause("DP-04"), pytest.mark.destructive, pytest.mark.needs("kubelet-stand-in")]

RETURNS = 2
REMOVALS = ("orderly-removal", "surprise-removal")  # the first the host offers


@pytest.mark.needs("hot-add")
def test_a_device_back_in_its_slot_is_healthy_again_under_its_id(host_factory, measurements, device_plugin):
    host = fresh_host(host_factory, device_plugin, "native")
    removal = next((c for c in REMOVALS if c in host.capabilities), None)
    if removal is None:
        pytest.skip(f"host {host.description} can remove no device ({' or '.join(REMOVALS)})")
    limit = budget(host, "dp_return_ms")
    figures = []
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        listed_healthy(kubelet, plugin)
        pid = host.runtime_pid()
        for target in host.targets(removal)[:RETURNS]:
            bdf = host.target_bdf(target)
            resource = resource_of(plugin, host, bdf)
            before_record = latest_list(kubelet, resource.name)
            before = advertised(before_record)
            device = LostDevice(host, kubelet, plugin, resource, bdf, before_record)
            mark = kubelet.last_seq()
            departures = host.get(removal).departures()
            host.get(removal).remove(target)
            device.await_loss(kubelet, mark, 60)
            await_departure(departures, bdf)
            mark = kubelet.last_seq()
            witness = GuestUeventWitness(host)
            try:
                host.get("hot-add").hot_add(target)
                healthy_before = healthy_ids(before)  # an ID lost earlier may stay Unhealthy: not judged
                back = wait_list(
                    kubelet, resource.name, mark,
                    lambda devices, ids=healthy_before: ids <= healthy_ids(devices),
                    answer_window_s(limit),
                    f"every ID it listed Healthy before ({sorted(healthy_before)}) Healthy again")
            finally:
                seen = witness.stop()
            figures.append(ms_after(back, int(kernel_event_ms(seen, "add", bdf) * 1e6)))
            _same_unit_under_its_ids(host, kubelet, plugin, resource, target, device, back)
        assert host.runtime_pid() == pid, "the plugin was restarted"
    summary = measurements.record("DP-04", "return_after_re_add", figures, "ms", budget=limit,
                                  budget_stat="max")
    assert summary.within_budget, summary.text()


def _same_unit_under_its_ids(host, kubelet, plugin, resource, target: str, device: LostDevice,
                             back: dict) -> None:
    """The IDs back Healthy stand for the unit back in the slot, by what the plugin says of them
    now (Allocate asked again): the same ID for the same unit, not the lost ID restored while it
    now stands for another device. The slot's BDF read again (a real host's rescan may number
    it anew)."""
    bdf = host.target_bdf(target)
    ties = plugin_ties(host, kubelet, resource.name, sorted(device.lost), topologies(back),
                       plugin.managed(resource))
    astray = {i for i in device.lost if bdf not in ties[i].bdfs}
    assert not astray, (f"{resource.name}: back Healthy, {named(ties, astray)} no longer stand for the "
                        f"device back at {bdf} (before its removal: {named(device.ties, device.lost)})")
