"""A plugin that dies is a finding at once (issue 45 #2), and a plugin that registers only other
resources than it was named with is bad input (#4): NodePlugin's launcher and NodeKubelet's waits,
with real processes in a local shell standing in for the node's."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hilconform.fixtures.device_plugin import Resource
from hilconform.fixtures.kubelet_node import NodeKubelet, ResourceNotRegistered
from hilconform.fixtures.kubelet_site import KubeletSite
from hilconform.fixtures.node_plugin import NodePlugin, PluginExited, exit_words


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str


class LocalNode:
    """The node's shell is this machine's bash; the kubelet site a temporary folder."""

    def __init__(self, folder: Path):
        self.site = KubeletSite(folder=str(folder), python_env="", plugin_dir=str(folder / "dp"))

    def get(self, capability: str):
        assert capability == "kubelet-stand-in"
        return self

    def kubelet_site(self) -> KubeletSite:
        return self.site

    def shell(self, command: str, timeout_s: float = 30) -> Ran:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout_s)
        return Ran(done.returncode, done.stdout, done.stderr)


class ShellPlugin(NodePlugin):
    def __init__(self, host, command: str, resources=("example.com/gpu",)):
        super().__init__(host, [Resource(r, frozenset({"10de:20b0"})) for r in resources], "device plugin t")
        self.command, self.pid = command, None

    def start(self) -> int:
        self.pid = self.launch(self.command, self.description)
        return 0

    def stop(self) -> None:
        self.stopping = True
        subprocess.run(["kill", "-TERM", str(self.pid)], check=False)


@pytest.fixture
def node(tmp_path):
    (tmp_path / "dp").mkdir()
    return LocalNode(tmp_path)


def _kubelet(node: LocalNode, records: list[dict]) -> NodeKubelet:
    kubelet = NodeKubelet(node, node.site)
    Path(kubelet.JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in records))
    return kubelet


def _ended(plugin: ShellPlugin, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not Path(plugin.status_path).exists() or not Path(plugin.status_path).read_text().strip():
        assert time.monotonic() < deadline, "the launcher never wrote the plugin's status"
        time.sleep(0.05)


def test_exit_words():
    assert exit_words(2) == "exit status 2"
    assert exit_words(137) == "killed by signal 9 (SIGKILL)"
    assert exit_words(143) == "killed by signal 15 (SIGTERM)"


def test_a_plugin_that_exits_at_once_ends_the_wait_at_once_with_its_words(node):
    plugin = ShellPlugin(node, "echo 'flag provided but not defined: -bogus' >&2; exit 2")
    plugin.start()
    _ended(plugin)
    kubelet = _kubelet(node, [])
    kubelet.watch_plugin(plugin)
    started = time.monotonic()
    with pytest.raises(PluginExited) as found:
        kubelet.wait_record("first ListAndWatch message of example.com/gpu", lambda r: False, 0, 60)
    assert time.monotonic() - started < 5
    assert "exit status 2" in str(found.value) and "flag provided but not defined: -bogus" in str(found.value)


def test_a_killed_plugin_is_named_with_its_signal(node):
    plugin = ShellPlugin(node, "echo serving; exec sleep 60")
    plugin.start()
    plugin.check_running()  # running: no finding
    subprocess.run(["kill", "-KILL", str(plugin.pid)], check=True)
    _ended(plugin)
    with pytest.raises(PluginExited, match=r"killed by signal 9 \(SIGKILL\)[\s\S]*serving"):
        plugin.check_running()


def test_a_plugin_the_harness_stops_is_no_finding(node):
    plugin = ShellPlugin(node, "exec sleep 60")
    plugin.start()
    plugin.stop()
    _ended(plugin)
    plugin.check_running()
    kubelet = _kubelet(node, [{"seq": 1, "kind": "list_and_watch", "resource": "example.com/gpu"}])
    kubelet.watch_plugin(plugin)
    assert kubelet.wait_record("a record", lambda r: r["seq"] == 1, 0, 5)["seq"] == 1


def test_a_running_plugin_is_waited_for_as_before(node):
    plugin = ShellPlugin(node, "exec sleep 60")
    plugin.start()
    try:
        kubelet = _kubelet(node, [])
        kubelet.watch_plugin(plugin)
        with pytest.raises(AssertionError, match="not within") as missed:
            kubelet.wait_record("a record", lambda r: False, 0, 1.0)
        assert not isinstance(missed.value, PluginExited)
    finally:
        plugin.stop()


def test_a_plugin_registering_only_other_resources_is_bad_input(node, monkeypatch):
    monkeypatch.setattr("hilconform.fixtures.kubelet_node.FOREIGN_GRACE_S", 0.5)
    plugin = ShellPlugin(node, "exec sleep 60", resources=("nvidia.com/GA100_SXM4_40GB",))
    plugin.start()
    try:
        kubelet = _kubelet(node, [{"seq": 1, "kind": "register_request",
                                   "resource": "nvidia.com/GA100_A100_SXM4_40GB", "message": {}}])
        kubelet.watch_plugin(plugin)
        with pytest.raises(ResourceNotRegistered) as bad:
            kubelet.wait_record("first ListAndWatch message", lambda r: False, 0, 30)
        text = str(bad.value)
        assert "nvidia.com/GA100_A100_SXM4_40GB" in text and "nvidia.com/GA100_SXM4_40GB" in text
    finally:
        plugin.stop()


def test_a_plugin_registering_its_own_and_others_is_waited_for(node, monkeypatch):
    monkeypatch.setattr("hilconform.fixtures.kubelet_node.FOREIGN_GRACE_S", 0.2)
    plugin = ShellPlugin(node, "exec sleep 60")
    plugin.start()
    try:
        kubelet = _kubelet(node, [{"seq": 1, "kind": "register_request", "resource": r, "message": {}}
                                  for r in ("example.com/other", "example.com/gpu")])
        kubelet.watch_plugin(plugin)
        with pytest.raises(AssertionError, match="not within"):
            kubelet.wait_record("a record", lambda r: False, 0, 1.0)
    finally:
        plugin.stop()
