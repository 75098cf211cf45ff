"""DP-07 orderly removal: a device removed through the runtime's orderly removal procedure (the
slot's attention button: the runtime isolates, drains, sends DEALLOCATE, powers the slot off) is
reported Unhealthy or dropped before the device leaves the bus: the DEALLOCATE signal reaches the
orchestrator first.

Judged on the node's clock: the stand-in's record of the ListAndWatch message without the device
Healthy must come before the kernel's `remove` uevent of the device (an independent `udevadm
monitor`). The stand-in runs above the kernel's interrupt threads (SCHED_FIFO 60,
emulators/kubelet_stand_in/promptness.py), so its receipt is the plugin's send and not a busy
node's late reading: on a one-vCPU guest pciehp's interrupt thread ran the removal before a
normal-priority stand-in read a loss the reference had sent 135 ms earlier. The lead is
recorded. Judged only for a plugin declared to belong to a runtime with
such a procedure (`--device-plugin-claim orderly-removal`, recorded in the certificate; the
reference front end claims it); any other plugin skips this clause with that reason, never
judged on a procedure it does not claim (fixtures/plugin_claims.py).
"""

from __future__ import annotations

import pytest
from dp_support import (
    fresh_host,
    kubelet_with_plugin,
    listed_healthy,
    remove_and_await_loss,
)

pytestmark = [pytest.mark.clause("DP-07"), pytest.mark.destructive, pytest.mark.needs("kubelet-stand-in")]

REMOVALS = 2


@pytest.mark.needs("orderly-removal")
@pytest.mark.plugin_claim("orderly-removal")
def test_orderly_removal_reaches_the_kubelet_before_the_device_leaves(host_factory, measurements,
                                                                      device_plugin):
    host = fresh_host(host_factory, device_plugin, "native")
    leads = []
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        listed_healthy(kubelet, plugin)
        for target in host.targets("orderly-removal")[:REMOVALS]:
            bdf = host.target_bdf(target)
            _, lost, removed_ms = remove_and_await_loss(
                host, kubelet, plugin, target, "orderly-removal", 60, wait_departure=True)
            lead_ms = removed_ms - lost["ts_ns"] / 1e6
            assert lead_ms > 0, (
                f"the kubelet heard of {bdf}'s orderly removal {-lead_ms:.0f} ms after it left the bus")
            leads.append(lead_ms)
    measurements.record("DP-07", "lead_before_removal", leads, "ms")
