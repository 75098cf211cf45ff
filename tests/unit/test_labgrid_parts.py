"""The parts of lab runs that need no coordinator: `--host labgrid:` parsing, the SSH target a
NetworkService becomes, where the coordinator address comes from, when hilconform defines
--lg-coordinator itself, and `hilconform lab run`'s tags and exit status."""

from __future__ import annotations

import pytest

from hilconform.fixtures.host_spec import HostSpecError, parse_host_spec
from hilconform.fixtures.labgrid_lab import SshTarget, coordinator_address
from hilconform.fixtures.labgrid_plugin import labgrid_plugin_will_load
from hilconform.reports.lab_night import NightHost
from hilconform.reports.lab_run import LabRunError, _exit_code, parse_tags


def test_a_labgrid_host_is_a_real_host_named_by_its_place_until_its_address_is_known():
    spec = parse_host_spec("labgrid:gpu-a100-1")
    assert (spec.kind, spec.place, spec.is_real, spec.over_ssh, str(spec)) == (
        "labgrid", "gpu-a100-1", True, False, "labgrid:gpu-a100-1")
    reached = spec.reached_at("root", "10.0.0.5", 2222)
    assert reached.over_ssh
    assert (reached.ssh_user, reached.ssh_host, reached.ssh_port) == ("root", "10.0.0.5", 2222)
    assert str(reached) == "labgrid:gpu-a100-1" and parse_host_spec("real:local").place is None
    with pytest.raises(HostSpecError, match="labgrid place name"):
        parse_host_spec("labgrid:a/b")


def test_a_network_service_becomes_the_ssh_spec_real_hosts_take():
    assert SshTarget("gpu1.lab", 22, "root").spec == "ssh://root@gpu1.lab:22"
    assert SshTarget("fd00::5", 2201, "hil").spec == "ssh://hil@[fd00::5]:2201"
    assert parse_host_spec("real:" + SshTarget("10.1.2.3", 2201, "hil").spec).ssh_port == 2201


def test_the_coordinator_is_the_option_else_the_environment_else_labgrids_default(monkeypatch):
    monkeypatch.delenv("LG_COORDINATOR", raising=False)
    assert coordinator_address(None) == "127.0.0.1:20408"
    monkeypatch.setenv("LG_COORDINATOR", "coord:1234")
    assert coordinator_address(None) == "coord:1234"
    assert coordinator_address("other:5") == "other:5"


class _Plugins:
    def __init__(self, blocked: bool):
        self.blocked = blocked

    def is_blocked(self, name: str) -> bool:
        return self.blocked and name == "labgrid"


def test_lg_coordinator_is_defined_here_only_where_labgrids_own_plugin_will_not_load(monkeypatch):
    pytest.importorskip("labgrid")
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    assert labgrid_plugin_will_load(_Plugins(blocked=False))
    assert not labgrid_plugin_will_load(_Plugins(blocked=True))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert not labgrid_plugin_will_load(_Plugins(blocked=False))


def test_lab_run_tags_are_key_value_pairs():
    assert parse_tags(["gpu=a100", "lab=nightly"]) == {"gpu": "a100", "lab": "nightly"}
    for bad in ("gpu", "=a100", "gpu="):
        with pytest.raises(LabRunError, match="KEY=VALUE"):
            parse_tags([bad])


def _host(status: str, exit_code: int | None) -> NightHost:
    return NightHost(place="p", status=status, reason="", run_dir="p/run" if exit_code is not None else None,
                     verdict=None, exit_code=exit_code, started="2026-12-04T01:00:00Z",
                     ended="2026-12-04T01:10:00Z")


def test_a_night_exits_with_its_worst_host():
    assert _exit_code(_host("certified", 0)) == 0
    assert _exit_code(_host("certified", 1)) == 1
    for status in ("held", "not_reserved", "error"):
        assert _exit_code(_host(status, None)) == 2
    assert _exit_code(_host("incomplete", 2)) == 2
