"""DP-04 return: a device that comes back (here: removed through the slot's attention button,
then the same unit re-added to its slot) is Healthy again within `dp_return_ms`, under the same
ID, without a plugin restart. (Orderly, not surprise removal, where the host offers it: QEMU
11.1's ACPI hot-plug cannot re-assign a device model's 256 MiB BAR in a slot it was removed
from, "BAR 1 failed to assign"; native pciehp can, on both device kinds. A host without orderly
removal, a real one, removes the device without warning (sysfs) and a rescan brings it back.)

Measured on the node's clock: the kernel's `add` uevent of the re-added device (an independent
`udevadm monitor`) to the stand-in's record of the ListAndWatch message listing every ID it had
before the loss Healthy again.
"""

from __future__ import annotations

import pytest
from dp_support import (
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
    one_lost,
    resource_of,
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
            before = advertised(latest_list(kubelet, resource.name))
            mark = kubelet.last_seq()
            departures = host.get(removal).departures()
            host.get(removal).remove(target)
            wait_list(kubelet, resource.name, mark, one_lost(before), 60, f"the device at {bdf} lost")
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
        assert host.runtime_pid() == pid, "the plugin was restarted"
    summary = measurements.record("DP-04", "return_after_re_add", figures, "ms", budget=limit,
                                  budget_stat="max")
    assert summary.within_budget, summary.text()
