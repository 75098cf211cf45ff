"""--host parsing, real-host profiles and the runtime config a real host gets (no host needed)."""

from __future__ import annotations

import os
import socket as sockets
import subprocess
import tomllib

import pytest

from hilconform.emulators.errors import ProfileError
from hilconform.fixtures.host_spec import HostSpecError, parse_host_spec
from hilconform.fixtures.real_host import ProfileMatchesNothing, choose_profile
from hilconform.fixtures.real_profile import available_real_profiles, load_real_profile
from hilconform.fixtures.remote_command import HostUnreachable, LoginRefused, classify_ssh_failure
from hilconform.fixtures.runtime_deployment import (
    UnknownRuntimeModule,
    check_runtime_module,
    runtime_config,
    runtime_tarball,
    socket_wait,
)


@pytest.mark.parametrize("text, user, host, port", [
    ("real:ssh://root@lab-a100-07", "root", "lab-a100-07", None),
    ("real:ssh://lab.example.org:2222", None, "lab.example.org", 2222),
    ("real:ssh://ci@127.0.0.1:40022", "ci", "127.0.0.1", 40022),
])
def test_ssh_hosts_parse(text, user, host, port):
    spec = parse_host_spec(text)
    assert (spec.kind, spec.ssh_user, spec.ssh_host, spec.ssh_port) == ("real", user, host, port)
    assert spec.is_real and spec.over_ssh


def test_local_host_parses():
    spec = parse_host_spec("real:local")
    assert spec.is_real and not spec.over_ssh


@pytest.mark.parametrize("text, words", [
    ("real:lab-host", "real:local or real:ssh://"),
    ("real:ssh://", "real:local or real:ssh://"),
    ("real:ssh://host:70000", "out of range"),
    ("metal:x", "unknown host kind"),
])
def test_bad_hosts_are_refused_with_the_reason(text, words):
    with pytest.raises(HostSpecError, match=words):
        parse_host_spec(text)


EXPECTED_IDS = {
    "a100": {"10de:20b0", "10de:20b2", "10de:20b1", "10de:20f1", "10de:20b5"},
    "t4": {"10de:1eb8"}, "h100": {"10de:2330", "10de:2331"}, "h200": {"10de:2335", "10de:233b"},
    "alveo-u250": {"10ee:5004", "10ee:5005"}, "alveo-u280": {"10ee:500c", "10ee:500d"},
    "intel-pac": {"8086:09c4", "8086:0b2b", "8086:0b30"},
}
EXPECTED_LINK = {"a100": "Gen3 x16", "h100": "Gen3 x16", "h200": "Gen3 x16", "t4": "Gen3 x8"}


@pytest.mark.parametrize("name", sorted(EXPECTED_IDS))
def test_shipped_profiles_select_the_issue_s_ids(name):
    profile = load_real_profile(name)
    assert set(profile.select_ids) == EXPECTED_IDS[name]
    if name in EXPECTED_LINK:
        assert str(profile.link_min) == EXPECTED_LINK[name]
    assert {"cold_discovery_ms", "reset_budget_ms", "removal_detect_ms"} <= set(profile.budgets)


def test_every_shipped_profile_loads():
    assert "emulated-guest" in available_real_profiles()
    for name in available_real_profiles():
        load_real_profile(name)


@pytest.mark.parametrize("body, key", [
    ('[profile]\nname="x"\ndescription="d"\nvendor="v"\n[devices]\nselect_ids=["10DE:20B0"]\n'
     'link_min={generation=3, width=16}\n', "devices.select_ids"),
    ('[profile]\nname="x"\ndescription="d"\nvendor="v"\n[devices]\nselect_ids=["10de:20b0"]\n'
     'link_min={generation=3}\n', "devices.link_min"),
    ('[profile]\nname="x"\ndescription="d"\nvendor="v"\ncolour="red"\n', "profile.colour"),
    ('[profile]\nname="x"\ndescription="d"\nvendor="v"\n[devices]\nselect_ids=["10de:20b0"]\n'
     'link_min={generation=3, width=16}\n[budgets]\ncold_discovery_s=1.5\n', "budgets.cold_discovery_s"),
])
def test_a_bad_profile_names_the_file_and_the_key(tmp_path, body, key):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ProfileError, match=key.replace(".", r"\.")):
        load_real_profile(str(path))


def _survey(*ids: str) -> dict:
    devices = {}
    for n, pair in enumerate(ids):
        vendor, device = pair.split(":")
        devices[f"0000:{n + 1:02x}:00.0"] = {"vendor": f"0x{vendor}", "device": f"0x{device}"}
    return {"devices": devices}


def test_profile_is_picked_by_ids_or_refused_when_it_matches_nothing():
    assert choose_profile(None, _survey("10de:1eb8", "8086:1533"), "lab").name == "t4"
    with pytest.raises(ProfileMatchesNothing, match="selects 10de:2330, 10de:2331, but the host has none"):
        choose_profile("h100", _survey("10de:1eb8"), "lab")
    with pytest.raises(ProfileMatchesNothing, match="cannot pick a real-host profile"):
        choose_profile(None, _survey("8086:1533"), "lab")


def test_read_only_runtime_config_never_resets_on_its_own():
    profile = load_real_profile("a100")
    config = tomllib.loads(runtime_config(profile, "/tmp/hilconform-rt.abc", read_only=True))
    assert config["transport"] == "unix:/tmp/hilconform-rt.abc/rt.sock"
    assert config["selector"]["ids"] == list(profile.select_ids)
    assert config["aer"]["reset_weight"] >= 1e12
    destructive = tomllib.loads(runtime_config(profile, "/tmp/x", read_only=False))
    assert "aer" not in destructive


def test_the_runtime_tarball_holds_the_package_and_nothing_else():
    import io
    import tarfile

    names = tarfile.open(fileobj=io.BytesIO(runtime_tarball())).getnames()
    assert "hilconform/__init__.py" in names and "hilconform/runtime/__main__.py" in names
    assert all(n.startswith("hilconform/") and "__pycache__" not in n for n in names)
    assert not any(n.startswith("hilconform/tests/") for n in names)


def test_a_mutant_runtime_ships_with_its_package_beside_the_reference():
    import io
    import tarfile

    module = check_runtime_module("hilconform.tests.mutants.recovery_taken_as_failed")
    names = tarfile.open(fileobj=io.BytesIO(runtime_tarball(module))).getnames()
    assert "hilconform/tests/mutants/recovery_taken_as_failed.py" in names
    assert "hilconform/tests/mutants/launch.py" in names and "hilconform/runtime/__main__.py" in names
    assert check_runtime_module(None) == check_runtime_module("hilconform.runtime") == "hilconform.runtime"


@pytest.mark.parametrize("module", ["hilconform.tests.mutants.no_such_mutant", "os",
                                    "hilconform.tests.mutants.../etc", "hilconform.runtime.service"])
def test_a_runtime_module_a_real_host_cannot_get_is_refused_by_name(module):
    with pytest.raises(UnknownRuntimeModule, match="cannot be deployed to a real host") as refused:
        check_runtime_module(module)
    assert repr(module) in str(refused.value) and "recovery_taken_as_failed" in str(refused.value)


@pytest.mark.parametrize("stderr, kind", [
    ("ssh: connect to host 10.0.0.9 port 22: Connection refused\r\n", HostUnreachable),
    ("ssh: Could not resolve hostname lab-x: Name or service not known\r\n", HostUnreachable),
    ("root@10.0.0.9: Permission denied (publickey).\r\n", LoginRefused),
    ("Host key verification failed.\r\n", LoginRefused),
])
def test_ssh_failures_say_which_kind_they_are(stderr, kind):
    error = classify_ssh_failure("ssh://lab", stderr)
    assert isinstance(error, kind)
    assert stderr.strip() in str(error)


def test_the_real_runtime_config_never_serves_the_kubelet_s_own_plugin_directory():
    """A real host may run a real kubelet: the reference front end's directory is the run's own,
    and it serves one resource per profile for every ID the profile selects."""
    profile = load_real_profile("h200")
    config = tomllib.loads(runtime_config(profile, "/tmp/hilconform-rt.abc", read_only=False))
    assert config["device_plugin_dir"] == "/tmp/hilconform-rt.abc/device-plugins"
    assert config["device_plugin_resources"] == {i: "hilconform.io/h200" for i in profile.select_ids}
    site = {"device_plugin_dir": "/tmp/hilconform-kubelet.x/device-plugins", "device_plugin": True}
    changed = tomllib.loads(runtime_config(profile, "/tmp/hilconform-rt.abc", False, site))
    assert changed["device_plugin_dir"] == site["device_plugin_dir"] and changed["device_plugin"] is True


def test_real_profiles_get_the_clauses_dp_defaults_unless_they_set_them():
    assert load_real_profile("h200").budgets["dp_loss_ms"] == 5000
    assert load_real_profile("h200").budgets["dp_first_list_ms"] == 10000
    assert load_real_profile("emulated-guest").budgets["dp_first_list_over_floor_ms"] == 20000


@pytest.mark.parametrize("pid_file, socket, code", [
    (None, False, 8),     # not started yet: waits out its time
    ("", False, 8),       # the file made but not yet written: not an exit
    ("dead", False, 7),   # a pid that is gone: the runtime exited
    ("self", True, 0),    # the socket is there
])
def test_the_socket_wait_takes_only_a_recorded_dead_pid_for_an_exit(tmp_path, pid_file, socket, code):
    if pid_file == "dead":
        done = subprocess.Popen(["true"])
        done.wait()
        (tmp_path / "runtime.pid").write_text(f"{done.pid}\n")
    elif pid_file is not None:
        (tmp_path / "runtime.pid").write_text("" if pid_file == "" else f"{os.getpid()}\n")
    if socket:
        listener = sockets.socket(sockets.AF_UNIX)
        listener.bind(str(tmp_path / "rt.sock"))
    result = subprocess.run(["sh", "-c", socket_wait(str(tmp_path), 0.3)], timeout=10)
    assert result.returncode == code
