"""DP-02 inventory: the advertised devices are exactly the host's managed devices of each
resource's model (the host's ground truth: none more, none missing), IDs distinct and stable
across a plugin restart, all Healthy on a healthy host, with a NUMA node that agrees with sysfs
(none or 0 where sysfs says -1)."""

from __future__ import annotations

import pytest
from dp_support import HEALTHY, advertised, kubelet_with_plugin, listed_healthy, running_kubelet

pytestmark = [pytest.mark.clause("DP-02"), pytest.mark.needs("kubelet-stand-in")]


def _numa_nodes(host, bdfs: list[str]) -> list[int]:
    out = host.shell(" ".join(f"cat /sys/bus/pci/devices/{b}/numa_node;" for b in bdfs)).stdout.split()
    return sorted(max(int(n), 0) for n in out)  # -1 (no NUMA information) is advertised as none or 0


def test_advertised_devices_are_the_managed_ones_healthy_with_stable_ids(host, device_plugin):
    first_ids = {}
    with running_kubelet(host) as kubelet:  # the plugin restarts under a running kubelet
        for round_ in range(2):
            _check_round(host, device_plugin, kubelet, round_, first_ids)


def _check_round(host, device_plugin, kubelet, round_: int, first_ids: dict) -> None:
    """One start of the plugin: what it lists (IDs kept from round 0 in `first_ids`)."""
    mark = kubelet.last_seq()
    with kubelet_with_plugin(host, device_plugin, kubelet=kubelet) as (kubelet, plugin):
        seen = listed_healthy(kubelet, plugin, mark)
        for resource in plugin.resources:
            record = seen[resource.name]
            devices = record["message"]["devices"]
            bdfs = plugin.managed(resource)
            ids = [d["ID"] for d in devices]
            assert len(ids) == len(set(ids)), f"{resource.name}: duplicate IDs {ids}"
            assert len(ids) == len(bdfs), (
                f"{resource.name} lists {len(ids)} devices; the host has {len(bdfs)}: {bdfs}")
            assert set(advertised(record).values()) == {HEALTHY}
            numa = sorted(max((n["ID"] for n in (d["topology"] or {}).get("nodes", [])), default=0)
                          for d in devices)
            sysfs = _numa_nodes(host, bdfs)
            assert numa == sysfs, f"{resource.name}: NUMA nodes {numa}, sysfs says {sysfs}"
            if round_ == 0:
                first_ids[resource.name] = sorted(ids)
            else:
                assert sorted(ids) == first_ids[resource.name], (
                    f"{resource.name}: IDs changed across a plugin restart: "
                    f"{first_ids[resource.name]} -> {sorted(ids)}")
