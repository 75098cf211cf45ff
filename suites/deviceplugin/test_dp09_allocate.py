"""DP-09 allocate: `Allocate` for healthy IDs returns, for exactly those IDs (one container
answer per container asked), device nodes / environment / CDI names; every device node it names
exists on the node; every CDI name it answers is defined by a CDI spec file on the node
(/etc/cdi, /var/run/cdi: where a CDI-aware runtime looks), and the device nodes that spec gives
it exist on the node; an unknown ID is refused with an error; `GetPreferredAllocation`, where the
plugin offers it, prefers only Healthy IDs it was offered, as many as asked."""

from __future__ import annotations

import pytest
from dp_support import HEALTHY, advertised, fresh_host, kubelet_with_plugin, listed_healthy

from hilconform.fixtures.kubelet_node import StandInError
from hilconform.fixtures.plugin_ties import CDI_SPEC_DIRS, cdi_resolved, node_cdi_specs

pytestmark = [pytest.mark.clause("DP-09"), pytest.mark.needs("kubelet-stand-in")]

UNKNOWN_ID = "no-such-device-hilconform"


def _missing_nodes(host, paths: list[str]) -> list[str]:
    if not paths:
        return []
    check = " ".join(f"[ -e '{p}' ] || echo '{p}';" for p in paths if "'" not in p)
    return host.shell(check).stdout.split()


def test_allocate_answers_existing_nodes_and_refuses_unknown_ids(host_factory, device_plugin):
    host = fresh_host(host_factory, device_plugin, None)  # a node of the plugin's, started with it
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        cdi_specs = None  # read from the node once, when the plugin first answers a CDI name
        for name, record in listed_healthy(kubelet, plugin).items():
            ids = sorted(i for i, health in advertised(record).items() if health == HEALTHY)
            containers = [[i] for i in ids] + [ids]
            answer = kubelet.ask("allocate", {"resource": name, "containers": containers})["response"]
            replies = answer["container_responses"]
            assert len(replies) == len(containers), (
                f"{name}: {len(replies)} answers to {len(containers)} containers")
            for asked, reply in zip(containers, replies, strict=True):
                nodes = [d["host_path"] for d in reply["devices"]]
                assert nodes or reply["envs"] or reply["cdi_devices"], (
                    f"{name}: Allocate({asked}) gave no device node, environment or CDI device")
                cdi_names = [c.get("name", "") for c in reply["cdi_devices"]]
                if cdi_names:
                    cdi_specs = node_cdi_specs(host, kubelet) if cdi_specs is None else cdi_specs
                    undefined, cdi_nodes = cdi_resolved(cdi_names, cdi_specs)
                    if undefined:  # specs written since they were read
                        cdi_specs = node_cdi_specs(host, kubelet)
                        undefined, cdi_nodes = cdi_resolved(cdi_names, cdi_specs)
                    assert undefined == [], (
                        f"{name}: Allocate({asked}) answers CDI devices {undefined} that no CDI spec on "
                        f"the node defines (it has {sorted(cdi_specs) or 'none'} in "
                        f"{', '.join(CDI_SPEC_DIRS)})")
                    nodes += cdi_nodes
                assert _missing_nodes(host, nodes) == [], (
                    f"{name}: Allocate({asked}) names device nodes that do not exist on the node: "
                    f"{_missing_nodes(host, nodes)}")
            with pytest.raises(StandInError) as refused:
                kubelet.ask("allocate", {"resource": name, "containers": [[UNKNOWN_ID]]})
            assert refused.value.code == "PLUGIN_ERROR", refused.value
            options = kubelet.state()["resources"][name]["options"] or {}
            if options.get("get_preferred_allocation_available"):
                preferred = kubelet.ask("preferred_allocation", {"resource": name, "containers": [
                    {"available": ids, "must_include": [], "size": 1}]})["response"]
                chosen = preferred["container_responses"][0]["deviceIDs"]
                assert len(chosen) == 1 and set(chosen) <= set(ids), (
                    f"{name}: preferred {chosen} out of {ids} (size 1)")
