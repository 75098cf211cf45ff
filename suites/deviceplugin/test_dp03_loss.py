"""DP-03 loss: a device removed without warning, fallen off the bus (all-ones reads) or FAULTED
(its configuration lost, a fatal error not recovered) is reported Unhealthy or dropped within
`dp_loss_ms`; the other devices stay listed and Healthy; the plugin keeps serving (Allocate of a
remaining Healthy device still answers).

"That device, not another": the IDs that must go are those the plugin itself ties to the lost
device's PCI address, asked before the fault (dp_support.LostDevice, fixtures/plugin_ties.py:
Allocate's device nodes resolved through sysfs, its environment, CDI names, topology; never the
ID's text). Counting Healthy IDs would pass a plugin that flags the next card instead of the
lost one (tests/mutants/dp_flags_wrong_device.py), and IDs are opaque, so a conformant plugin
with hashed IDs is judged the same way.

Measured on the node's clock, to the stand-in's record of the ListAndWatch message without the
device Healthy: from the kernel's `remove` uevent (an independent `udevadm monitor` on the node)
for a removal; from the fault's request, mapped onto the node's clock (erring early), for a
device that stays on the bus (no uevent marks those). Removals: up to LOSSES devices, one after
the other; each other fault on one device of a fresh host that boots with the plugin.
"""

from __future__ import annotations

import pytest
from dp_support import (
    HEALTHY,
    advertised,
    answer_window_s,
    budget,
    config_lost,
    fault_and_await_loss,
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
                host, kubelet, plugin, target, "surprise-removal", answer_window_s(limit))
            figures.append(ms_after(lost, int(removed_ms * 1e6)))
            _still_serving(kubelet, resource, lost)
    summary = measurements.record("DP-03", "loss_surprise_removal", figures, "ms", budget=limit,
                                  budget_stat="max")
    assert summary.within_budget, summary.text()


# A device that stays on the bus but is no use: how each capability takes it out of service.
IN_PLACE_LOSSES = {
    "config-loss": lambda host, target: host.get("config-loss").lose_config(target),
    "fell-off-bus": lambda host, target: host.get("fell-off-bus").fall_off_bus(target),
}


@pytest.mark.parametrize("capability", [
    pytest.param("config-loss", marks=pytest.mark.needs("config-loss")),
    pytest.param("fell-off-bus", marks=pytest.mark.needs("fell-off-bus")),
])
def test_a_device_still_on_the_bus_but_lost_is_unhealthy_or_dropped(host_factory, measurements, device_plugin,
                                                                     capability):
    """config-loss: the configuration lost behind the driver (BARs cleared: a runtime FAULTs it);
    fell-off-bus: every read all ones. The device stays in the kernel's tree: no uevent tells a
    plugin, only a health check of its own (or its runtime's) can."""
    host = fresh_host(host_factory, device_plugin, None)
    limit = budget(host, "dp_loss_ms")
    target = host.targets(capability)[0]
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        listed_healthy(kubelet, plugin)
        inject = IN_PLACE_LOSSES[capability]
        resource, lost, started_ms = fault_and_await_loss(
            host, kubelet, plugin, target, lambda: inject(host, target), answer_window_s(limit))
        _still_serving(kubelet, resource, lost)
    figure = ms_after(lost, int(started_ms * 1e6))
    summary = measurements.record("DP-03", f"loss_{capability.replace('-', '_')}", [figure], "ms",
                                  budget=limit, budget_stat="max")
    assert summary.within_budget, summary.text()


@pytest.mark.needs("aer-fatal")
def test_a_fatal_error_not_recovered_is_unhealthy_or_dropped(host_factory, measurements, device_plugin):
    """A fatal error resets the link. Where the kernel's recovery fails, or the link comes back
    with the device's configuration lost (no driver restored it: vfio-pci with no user), the device
    is out of service (a runtime FAULTs it) while it stays on the bus. Judged on the node's own
    evidence (the kernel's recovery line, the configuration read back), never on what the plugin
    or its runtime says: a device the kernel recovered intact is not this case, and the next target
    is tried; the test skips, saying so, when the kernel recovered every one."""
    host = fresh_host(host_factory, device_plugin, None)
    limit = budget(host, "dp_loss_ms")
    recovered = []
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        listed_healthy(kubelet, plugin)
        for target in host.targets("aer-fatal"):
            bdf = host.target_bdf(target)

            def out_of_service(fault, bdf=bdf) -> str:
                if fault.details["recovery"] != "successful":
                    return f"the kernel's recovery {fault.details['recovery']}"
                lost = config_lost(host, bdf)
                return "configuration lost after the link reset: " + "; ".join(lost) if lost else ""

            found = fault_and_await_loss(
                host, kubelet, plugin, target,
                lambda target=target: host.get("aer-fatal").aer_fatal(target, wait_recovery=True),
                answer_window_s(limit), out_of_service)
            if found is None:
                recovered.append(bdf)
                continue
            resource, lost, started_ms = found
            _still_serving(kubelet, resource, lost)
            break
        else:
            pytest.skip(f"host {host.description}: the kernel recovered every device intact from a fatal "
                        f"error ({', '.join(recovered)}): no unrecovered fatal error to judge")
    figure = ms_after(lost, int(started_ms * 1e6))
    figure = ms_after(lost, int(started_ms * 1e6))
    summary = measurements.record("DP-03", "loss_fatal_not_recovered", [figure], "ms", budget=limit,
                                  budget_stat="max")
    assert summary.within_budget, summary.text()


def _still_serving(kubelet, resource: str, lost: dict) -> None:
    """Allocate of a device the loss left Healthy still answers (the plugin keeps serving)."""
    remaining = [i for i, health in advertised(lost).items() if health == HEALTHY]
    if remaining:
        answer = kubelet.ask("allocate", {"resource": resource, "containers": [remaining[:1]]})
        assert len(answer["response"]["container_responses"]) == 1
