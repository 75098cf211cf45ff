"""DP-03 loss: a device removed without warning is reported Unhealthy or dropped within
`dp_loss_ms`; the other devices stay listed and Healthy; the plugin keeps serving (Allocate of a
remaining Healthy device still answers).

Measured on the node's clock: the kernel's `remove` uevent (an independent `udevadm monitor`
on the node) to the stand-in's record of the ListAndWatch message without the device Healthy.
Up to LOSSES devices, one after the other, on a host that boots with the plugin.
"""

from __future__ import annotations

import pytest
from dp_support import (
    HEALTHY,
    advertised,
    budget,
    fresh_host,
    kubelet_with_plugin,
    listed_healthy,
    ms_after,
    remove_and_await_loss,
)

pytestmark = [pytest.mark.clause("DP-03"), pytest.mark.destructive, pytest.mark.needs("kubelet-stand-in")]

LOSSES = 2


@pytest.mark.needs("surprise-removal")
def test_a_device_removed_without_warning_is_dropped_or_unhealthy(host_factory, measurements, device_plugin):
    host = fresh_host(host_factory, device_plugin, "acpi")
    limit = budget(host, "dp_loss_ms")
    figures = []
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        listed_healthy(kubelet, plugin)
        for target in host.targets("surprise-removal")[:LOSSES]:
            resource, lost, removed_ms = remove_and_await_loss(
                host, kubelet, plugin, target, "surprise-removal", limit / 1000 + 30)
            figures.append(ms_after(lost, int(removed_ms * 1e6)))
            remaining = [i for i, health in advertised(lost).items() if health == HEALTHY]
            if remaining:
                answer = kubelet.ask("allocate", {"resource": resource, "containers": [remaining[:1]]})
                assert len(answer["response"]["container_responses"]) == 1
    summary = measurements.record("DP-03", "loss_surprise_removal", figures, "ms", budget=limit,
                                  budget_stat="max")
    assert summary.within_budget, summary.text()
