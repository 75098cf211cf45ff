"""DP-07 orderly removal: a device removed through the runtime's orderly removal procedure (the
slot's attention button: the runtime isolates, drains, sends DEALLOCATE, powers the slot off) is
reported Unhealthy or dropped before the device leaves the bus: the DEALLOCATE signal reaches the
orchestrator first.

Judged on the node's clock: the stand-in's record of the ListAndWatch message without the device
Healthy must come before the kernel's `remove` uevent of the device (an independent `udevadm
monitor`). The lead is recorded. (A plugin that belongs to no runtime with such a procedure would
skip this clause with that reason; the reference front end belongs to one.)
"""

from __future__ import annotations

import pytest
from dp_support import (
    advertised,
    fresh_host,
    kernel_event_ms,
    kubelet_with_plugin,
    latest_list,
    listed_healthy,
    one_lost,
    resource_of,
    wait_gone,
    wait_list,
)

from hilconform.fixtures.uevent_witness import GuestUeventWitness

pytestmark = [pytest.mark.clause("DP-07"), pytest.mark.destructive, pytest.mark.needs("kubelet-stand-in")]

REMOVALS = 2


@pytest.mark.needs("orderly-removal")
def test_orderly_removal_reaches_the_kubelet_before_the_device_leaves(host_factory, measurements,
                                                                      device_plugin):
    host = fresh_host(host_factory, device_plugin, "native")
    leads = []
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        listed_healthy(kubelet, plugin)
        for target in host.targets("orderly-removal")[:REMOVALS]:
            bdf = host.target_bdf(target)
            resource = resource_of(plugin, host, bdf)
            before = advertised(latest_list(kubelet, resource.name))
            mark = kubelet.last_seq()
            witness = GuestUeventWitness(host)
            try:
                host.get("orderly-removal").remove(target)
                lost = wait_list(kubelet, resource.name, mark, one_lost(before), 60,
                                 f"the device at {bdf} gone or Unhealthy and the others Healthy")
                wait_gone(host, bdf)
            finally:
                seen = witness.stop()
            removed_ms = kernel_event_ms(seen, "remove", bdf)
            lead_ms = removed_ms - lost["ts_ns"] / 1e6
            assert lead_ms > 0, (
                f"the kubelet heard of {bdf}'s orderly removal {-lead_ms:.0f} ms after it left the bus")
            leads.append(lead_ms)
    measurements.record("DP-07", "lead_before_removal", leads, "ms")
