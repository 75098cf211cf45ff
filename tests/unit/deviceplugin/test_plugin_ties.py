"""Tying a plugin's IDs to PCI addresses (fixtures/plugin_ties.py), only through what it says.

DP-03/DP-04 judge the lost device's IDs by this tie; a tie made from the ID's own text would
pass a plugin that flags the wrong device whenever its IDs happen to spell addresses, and fail a
conformant plugin whose IDs are hashes. The node's side (the script that resolves device nodes
through sysfs) runs here on this machine's own /sys.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from hilconform.fixtures.plugin_ties import (
    Untied,
    bdf_candidates,
    cdi_devices,
    cdi_resolved,
    ids_of,
    node_script_command,
    plugin_ties,
    resolve,
)

A, B, BRIDGE = "0000:01:00.0", "0000:02:00.0", "0000:00:1c.0"
MANAGED = [A, B]


def _node(nodes=None, exists=(A, B, BRIDGE), numa=None) -> dict:
    return {"nodes": nodes or {}, "exists": {b: True for b in exists}, "numa": numa or {}, "cdi": {}}


def _reply(nodes=(), envs=None, cdi=()) -> dict:
    return {"devices": [{"host_path": n, "container_path": n} for n in nodes], "envs": envs or {},
            "cdi_devices": [{"name": c} for c in cdi], "mounts": [], "annotations": {}}


def test_bdfs_are_read_from_text_but_never_from_the_ids_own_text():
    assert bdf_candidates("0000:01:00.0,0000:0A:00.1", []) == {A, "0000:0a:00.1"}
    assert bdf_candidates("dev=02:00.0", []) == {B}  # short: domain 0000
    assert bdf_candidates("id-0000:01:00.0", ["id-0000:01:00.0"]) == set()
    assert bdf_candidates("pw-3f2a1b00c9d1 10000:01:00.00", []) == set()


def test_device_nodes_tie_through_sysfs_and_a_generic_node_ties_nothing():
    answer = _node({"/dev/vfio/12": {"bdfs": [A, BRIDGE], "via": "group 12"},
                    "/dev/vfio/vfio": {"bdfs": [], "via": "/sys/devices/virtual/misc/vfio"},
                    "/dev/nvme1": {"bdfs": [B], "via": "/sys/devices/.../0000:02:00.0/nvme"}})
    ties = resolve({"x": _reply(["/dev/vfio/vfio", "/dev/vfio/12"]), "y": _reply(["/dev/nvme1"])}, {},
                   MANAGED, answer, {})
    assert ties["x"].bdfs == {A}  # the group's bridge is not a managed device of the resource
    assert ties["y"].bdfs == {B}
    assert ids_of(ties, A) == {"x"} and ids_of(ties, B) == {"y"}


def test_environment_ties_only_addresses_that_exist_and_not_the_ids_echoed():
    ties = resolve({"0000:02:00.0": _reply(envs={"IDS": "0000:02:00.0", "PCI": A})}, {}, MANAGED,
                   _node(exists=(A,)), {})
    assert ties["0000:02:00.0"].bdfs == {A}  # the ID spells B, what the plugin says is A
    ties = resolve({"0000:02:00.0": _reply(envs={"IDS": "0000:02:00.0"})}, {}, MANAGED, _node(), {})
    assert ties["0000:02:00.0"].bdfs == frozenset()


def test_cdi_names_tie_by_their_address_or_by_the_spec_that_defines_them():
    spec = {"/etc/cdi/x.yaml": "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices:\n"
            "- name: gpu0\n  containerEdits:\n    deviceNodes: [{path: /dev/accel0}]\n"
            "- name: gpu1\n  containerEdits:\n    env: [GPU_PCI=0000:02:00.0]\n",
            "/etc/cdi/bad.json": "{not json"}
    specs = cdi_devices(spec)
    assert set(specs) == {"example.com/gpu=gpu0", "example.com/gpu=gpu1"}
    answer = _node({"/dev/accel0": {"bdfs": [A], "via": "accel"}})
    ties = resolve({"i0": _reply(cdi=["example.com/gpu=gpu0"]), "i1": _reply(cdi=["example.com/gpu=gpu1"]),
                    "i2": _reply(cdi=["example.com/gpu=0000:02:00.0"])}, {}, MANAGED, answer, specs)
    assert (ties["i0"].bdfs, ties["i1"].bdfs, ties["i2"].bdfs) == ({A}, {B}, {B})


def test_cdi_names_resolve_to_their_specs_device_nodes_or_are_named_undefined():
    """DP-09: a CDI name Allocate answers must be defined by a spec on the node; its device nodes
    (hostPath where the spec gives one, else path) are then checked on the node."""
    specs = cdi_devices({"/var/run/cdi/pciwatch.json": json.dumps({
        "cdiVersion": "0.6.0", "kind": "example.com/a100", "devices": [
            {"name": "pw-1", "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/7"}]}},
            {"name": "pw-2", "containerEdits": {
                "deviceNodes": [{"path": "/dev/gpu", "hostPath": "/dev/dri/card1"}], "env": ["X=1"]}},
            {"name": "pw-3", "containerEdits": {"env": ["X=2"]}}]})})
    names = ["example.com/a100=pw-1", "example.com/a100=pw-2", "example.com/a100=pw-3"]
    assert cdi_resolved(names, specs) == ([], ["/dev/vfio/7", "/dev/dri/card1"])
    assert cdi_resolved(["example.com/a100=pw-9", "example.com/gpu=pw-1", "pw-1"], specs) == (
        ["example.com/a100=pw-9", "example.com/gpu=pw-1", "pw-1"], [])  # another kind, or unqualified


def test_topology_ties_only_where_one_managed_device_is_on_that_numa_node():
    numa = {A: 0, B: 1}
    topo = {"i0": {"nodes": [{"ID": 1}]}, "i1": {"nodes": [{"ID": 0}]}, "i2": None}
    ties = resolve({i: _reply() for i in topo}, topo, MANAGED, _node(numa=numa), {})
    assert (ties["i0"].bdfs, ties["i1"].bdfs, ties["i2"].bdfs) == ({B}, {A}, frozenset())
    ties = resolve({"i0": _reply()}, {"i0": {"nodes": [{"ID": 0}]}}, MANAGED, _node(numa={A: -1, B: 0}), {})
    assert ties["i0"].bdfs == frozenset()  # two devices on node 0 (-1 counts as 0): not told apart


class _LocalHost:
    """This machine as the node: the resolving script runs on its own /sys."""

    def shell(self, script: str, timeout_s: float = 30.0):
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout_s)

        class Result:
            exit_code, stdout, stderr = done.returncode, done.stdout, done.stderr
        return Result()


class _Kubelet:
    class site:
        python_env = ""

    def __init__(self, replies):
        self.replies, self.asked = replies, []

    def ask(self, method, params):
        self.asked.append((method, params))
        return {"response": {"container_responses": [self.replies[c[0]] for c in params["containers"]]}}


def test_the_node_script_resolves_on_a_real_sysfs():
    done = subprocess.run(node_script_command("", {"nodes": ["/dev/null", "/dev/vfio/99999", "/nonexistent"],
                                                   "bdfs": ["ffff:ff:1f.7"], "numa": [], "cdi_dirs": []}),
                          shell=True, capture_output=True, text=True, timeout=30, check=True)
    answer = json.loads(done.stdout)
    assert answer["nodes"]["/dev/null"]["bdfs"] == []  # a node with no PCI device above it
    assert answer["nodes"]["/dev/vfio/99999"]["bdfs"] == []
    assert "not on the node" in answer["nodes"]["/nonexistent"]["via"]
    assert answer["exists"] == {"ffff:ff:1f.7": False}


def test_an_id_the_plugin_leaves_untied_fails_naming_what_it_said():
    kubelet = _Kubelet({"a": _reply(["/dev/null"], {"X": "1"}), "b": _reply(["/dev/null"])})
    with pytest.raises(Untied) as untied:
        plugin_ties(_LocalHost(), kubelet, "example.com/gpu", ["a", "b"], {},
                    ["ffff:ff:1f.6", "ffff:ff:1f.7"])
    text = str(untied.value)
    assert "ID a" in text and "/dev/null" in text and "never guessed from the ID's text" in text
    assert kubelet.asked == [("allocate", {"resource": "example.com/gpu", "containers": [["a"], ["b"]]})]
    assert isinstance(untied.value, AssertionError)  # a failure of the clause, not an inconclusive (skip)
