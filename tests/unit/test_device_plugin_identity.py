"""What a run records of the device plugin the DP tests certified (fixtures/device_plugin.py,
`PluginChoice.identity`), and the Register API versions the kubelet stand-in's records show."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import device_plugin_resources
from hilconform.fixtures import device_plugin
from hilconform.fixtures.command_plugin import plugin_command, plugin_resources
from hilconform.fixtures.device_plugin import PluginChoice, kubelet_with_plugin
from hilconform.fixtures.kubelet_node import NodeKubelet
from hilconform.fixtures.kubelet_site import GUEST_SITE


class _ProfileHost:
    """An emulated host as the plugin choice sees it: its profile's resources, booted with the
    reference front end on."""

    def __init__(self, profile):
        self.profile = profile
        self.runtime = SimpleNamespace(hello={})
        self.runtime_overrides = dict(device_plugin.FRONT_END_ON)

    def get(self, wanted):
        assert wanted == "kubelet-stand-in"
        return self

    def device_plugin_resources(self):
        return device_plugin_resources(self.profile)

    def kubelet_site(self):
        return GUEST_SITE

MIXED_RESOURCES = [
    {"name": "hilconform.io/nvidia-tesla-t4", "device_ids": ["10de:1eb8"]},
    {"name": "hilconform.io/xilinx-alveo-u250", "device_ids": ["10ee:5005"]},
]


def _script(tmp_path):
    path = tmp_path / "my-plugin"
    path.write_bytes(b"#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return path


def test_a_command_plugin_is_named_by_its_command_sha256_and_the_resources_it_was_told(tmp_path):
    script = _script(tmp_path)
    command = plugin_command(f"{script} --verbose")
    choice = PluginChoice(command, plugin_resources(["example.com/gpu=10de:20b2,10de:20b0"]))
    assert choice.identity() == {
        "kind": "command",
        "command": f"{script} --verbose",
        "path": str(script.resolve()),
        "sha256": command.sha256,
        "image": None,
        "resources": [{"name": "example.com/gpu", "device_ids": ["10de:20b0", "10de:20b2"]}],
        "api_versions": [],
        "claims": [],  # a command plugin claims nothing unless whoever certifies it says so
    }


def test_what_a_plugin_is_declared_to_claim_is_recorded_and_the_reference_claims_its_own(tmp_path):
    command = plugin_command(str(_script(tmp_path)))
    declared = PluginChoice(command, plugin_resources(["example.com/gpu=10de:20b0"]), ["orderly-removal"])
    assert [c["name"] for c in declared.identity()["claims"]] == ["orderly-removal"]
    assert declared.identity()["claims"][0]["clause"] == "DP-07"
    assert [c["name"] for c in PluginChoice().identity()["claims"]] == ["orderly-removal"]


def test_the_reference_front_end_is_named_with_the_resources_of_the_hosts_it_served():
    choice = PluginChoice()
    assert choice.identity()["resources"] == []  # known once a DP test attaches it to a host
    for _ in range(2):  # two DP tests, each on a fresh host of the profile
        choice.attach(_ProfileHost(load_profile("mixed")))
    identity = choice.identity()
    assert (identity["kind"], identity["command"], identity["path"], identity["sha256"]) == (
        "reference-front-end",
        None,
        None,
        None,
    )
    assert identity["resources"] == MIXED_RESOURCES


class _StandInShell:
    """A node shell whose stand-in journal holds `records` (as its JSON lines, plus `tail`, e.g.
    a line still being written) and whose control answers every `records` request with
    `asked`, in one page."""

    def __init__(self, records: list[dict], tail: str = "", asked: list[dict] = ()):
        self.journal = "".join(json.dumps(r) + "\n" for r in records) + tail
        self.asked = list(asked)
        self.commands: list[str] = []

    def shell(self, command: str, timeout_s: float = 60.0):
        self.commands.append(command)
        if command.startswith("tail -c +"):
            offset = int(command.split()[2][1:]) - 1
            return SimpleNamespace(exit_code=0, stdout=self.journal[offset:], stderr="")
        page = {"records": self.asked, "more": False, "last_seq": len(self.asked)}
        return SimpleNamespace(exit_code=0, stdout=json.dumps({"result": page}), stderr="")


def _register_request(seq: int, version: str) -> dict:
    message = {"version": version, "endpoint": "gpu.sock", "resource_name": "example.com/gpu"}
    return {
        "seq": seq,
        "ts_ns": seq,
        "kind": "register_request",
        "resource": "example.com/gpu",
        "message": message,
    }


def test_the_register_api_versions_are_those_of_the_records_the_tests_read():
    other = {"seq": 2, "ts_ns": 2, "kind": "options", "resource": "example.com/gpu", "message": {}}
    node = _StandInShell([_register_request(1, "v1beta1"), other, _register_request(3, "v1alpha")])
    kubelet = NodeKubelet(node, GUEST_SITE)
    assert kubelet.register_versions == set()
    kubelet.records(0)
    assert kubelet.register_versions == {"v1beta1", "v1alpha"}


def test_the_plugin_choice_keeps_the_versions_its_kubelet_saw(monkeypatch):
    class SeenStandIn:
        def __init__(self, host):
            self.register_versions = {"v1beta1"}

        def start(self):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(device_plugin, "NodeKubelet", SeenStandIn)
    host = _ProfileHost(load_profile("a100-stock"))
    choice = PluginChoice()
    with kubelet_with_plugin(host, choice, booted=True):
        pass
    assert choice.identity()["api_versions"] == ["v1beta1"]
    assert choice.identity()["resources"] == [
        {"name": "hilconform.io/nvidia-a100-sxm4-40gb", "device_ids": ["1b36:0010"]}
    ]


def test_records_come_from_the_journal_a_line_being_written_waits_and_none_is_read_twice():
    first, second = _register_request(1, "v1beta1"), _register_request(2, "v1beta1")
    half = json.dumps(second)[:20]
    node = _StandInShell([first], tail=half)
    kubelet = NodeKubelet(node, GUEST_SITE)
    assert [r["seq"] for r in kubelet.records(0)] == [1]
    node.journal = node.journal[: -len(half)] + json.dumps(second) + "\n"
    assert [r["seq"] for r in kubelet.records(0)] == [1, 2]
    assert [r["seq"] for r in kubelet.records(1)] == [2]
    assert kubelet.last_seq() == 2
    assert not any("kubelet_stand_in.ask" in c for c in node.commands), "no interpreter was asked"
    assert node.commands[-1].startswith(f"tail -c +{len(node.journal) + 1} ")


def test_past_a_full_journal_the_records_are_asked_for():
    journaled = [_register_request(1, "v1beta1")]
    later = [{"seq": 2, "ts_ns": 2, "kind": "options", "resource": "example.com/gpu", "message": {}}]
    node = _StandInShell(journaled, tail=json.dumps({"journal_full": True, "last_seq": 1}) + "\n",
                         asked=later)
    kubelet = NodeKubelet(node, GUEST_SITE)
    assert [r["seq"] for r in kubelet.records(0)] == [1, 2]
    assert any("kubelet_stand_in.ask" in c for c in node.commands)
