"""How the host factory starts a host whose runtime is not the profile's (fixtures/fresh_host.py),
without a VM: it starts as the profile's configuration with the reference runtime, then its
runtime (module and config) is started in its place."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hilconform.fixtures import fresh_host

PROFILE_CONFIG = "profile config"


class _VM:
    def __init__(self, runtime_config: str, runtime_module: str | None, node_services: str | None = None):
        self.profile = SimpleNamespace(name="p")
        self.runtime_config, self.runtime_module = runtime_config, runtime_module
        self.node_services = node_services
        self.ssh_authorized_key = None
        self.log: list[tuple] = []

    def configuration_key(self, runtime_config=None, bare_node=False) -> str:
        module, services = (None, None) if bare_node else (self.runtime_module, self.node_services)
        return f"{runtime_config or self.runtime_config}|{module}" + (f"|{services}" if services else "")

    def start(self, restore=None):
        self.log.append(("start", self.runtime_config, self.runtime_module, restore))

    def start_node_services(self, commands: str):
        self.node_services = commands
        self.log.append(("services", commands))

    def switch_runtime_module(self, module: str):
        self.runtime_module = module
        self.log.append(("module", module))


class _Host:
    def __init__(self, vm: _VM, overrides: dict | None = None):
        self.vm, self.runtime_overrides = vm, overrides or {}

    def forget_runtime_overrides(self):
        self.vm.log.append(("forget overrides",))

    def restart_runtime(self, overrides=None):
        self.vm.log.append(("restart", overrides))

    def restart_runtime_with_config(self, text):
        self.vm.log.append(("restart with config", text))


class _Saved:
    def __init__(self, keys: set[str]):
        self.keys, self.why_booted, self.released = keys, {}, []

    def restorable(self, key, while_waiting=None):
        return f"saved {key}" if key in self.keys else None

    def release(self, key):
        self.released.append(key)


@pytest.fixture(autouse=True)
def _profile_config(monkeypatch):
    def config_for(profile, overrides=None):
        return f"{PROFILE_CONFIG} {overrides}" if overrides else PROFILE_CONFIG
    monkeypatch.setattr(fresh_host, "runtime_config_for", config_for)


def test_a_runtime_module_under_test_starts_in_a_restored_host_of_the_reference_runtime():
    vm = _VM(PROFILE_CONFIG, "hilconform.tests.mutants.skip_drain")
    saved = _Saved({f"{PROFILE_CONFIG}|None"})
    assert fresh_host._started_with_profile_config(_Host(vm), saved) is True
    assert vm.log == [("forget overrides",),
                      ("start", PROFILE_CONFIG, None, f"saved {PROFILE_CONFIG}|None"),
                      ("module", "hilconform.tests.mutants.skip_drain"),
                      ("restart", None)]
    assert saved.released == [f"{PROFILE_CONFIG}|None"]
    assert vm.configuration_key() == f"{PROFILE_CONFIG}|hilconform.tests.mutants.skip_drain"  # saved so


def test_a_module_and_config_of_its_own_both_replace_the_reference_runtimes():
    vm = _VM(PROFILE_CONFIG + " {'device_plugin': True}", "mut")
    host = _Host(vm, {"device_plugin": True})
    assert fresh_host._started_with_profile_config(host, _Saved({f"{PROFILE_CONFIG}|None"})) is True
    assert vm.log[-2:] == [("module", "mut"), ("restart", {"device_plugin": True})]


def test_the_reference_runtime_with_the_profiles_config_starts_as_itself():
    vm = _VM(PROFILE_CONFIG, None)
    assert fresh_host._started_with_profile_config(_Host(vm), _Saved({f"{PROFILE_CONFIG}|None"})) is False
    assert vm.log == []


def test_node_services_start_in_a_restored_host_before_its_runtime_as_at_a_boot():
    vm = _VM(PROFILE_CONFIG + " {'device_plugin': True}", None, node_services="start the kubelet stand-in")
    host = _Host(vm, {"device_plugin": True})
    assert fresh_host._started_with_profile_config(host, _Saved({f"{PROFILE_CONFIG}|None"})) is True
    assert vm.log == [("forget overrides",),
                      ("start", PROFILE_CONFIG, None, f"saved {PROFILE_CONFIG}|None"),
                      ("services", "start the kubelet stand-in"),
                      ("restart", {"device_plugin": True})]
    assert vm.configuration_key().endswith("|start the kubelet stand-in")  # saved under its own key


def test_node_services_alone_make_a_host_start_as_the_profiles_first():
    vm = _VM(PROFILE_CONFIG, None, node_services="svc")
    assert fresh_host._started_with_profile_config(_Host(vm), _Saved({f"{PROFILE_CONFIG}|None"})) is True
    assert vm.log[1][1:3] == (PROFILE_CONFIG, None) and vm.log[2] == ("services", "svc")
