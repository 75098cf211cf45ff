"""`--host real:ssh://...` against the emulated guest as a stand-in lab host.

The guest boots with sshd on a loopback port and no runtime of its own; the
suites run in a pytest subprocess that deploys the runtime over SSH, exactly as
on a lab machine. Checks: the read-only suites pass and change nothing on the
host (its state compared before and after); the destructive sysfs paths pass
and every device is back afterwards; REAL-01 fails when the profile demands a
link the host does not have. Bad input is tested in test_real_host_bad_input.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from xml.etree import ElementTree

import pytest
from pciwatch_pod import pciwatch_pod
from stand_in_real_host import StandInHost, host_state, outcome, run_suites

from hilconform.fixtures.real_host import RealHost
from hilconform.fixtures.real_safety import UnsafeTarget
from hilconform.fixtures.remote_command import SshRunner, put_file

ROOT = Path(__file__).resolve().parent.parent.parent
# Read-only tests that a real host must run, not skip.
MUST_PASS_READ_ONLY = (
    "test_negotiated_link_meets_the_model_minimum",
    "test_boot_inventory_matches_the_node_kernel",
    "test_allocate_release_cycle",
    "test_unrenewed_lease_expires_at_its_ttl_and_a_renewed_one_is_kept",
)


def passed_tests(junit: Path) -> set[str]:
    """Names of the test cases that passed (neither skipped, failed nor errored)."""
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    return {c.get("name") for c in cases if not any(child.tag in ("skipped", "failure", "error")
                                                    for child in c)}


def test_read_only_suites_pass_and_change_nothing_on_the_host(stand_in, tmp_path):
    before = host_state(stand_in)
    junit = tmp_path / "junit.xml"
    # `slow` (DISC-03's runtime restarts) is left to lab runs: its budget is load-sensitive under TCG.
    done = run_suites(stand_in, "suites", "-m", "not destructive and not slow", f"--junitxml={junit}")
    assert done.returncode == 0, outcome(done)
    passed = passed_tests(junit)
    for must_pass in MUST_PASS_READ_ONLY:
        assert must_pass in passed, f"{must_pass} did not pass:\n{outcome(done)}"
    after = host_state(stand_in)
    assert after == before, "a read-only run changed the host:\n" + "\n".join(
        f"- {a}\n+ {b}" for a, b in zip(before.splitlines(), after.splitlines(), strict=False) if a != b)


# Destructive tests the stand-in offers what they need for (sysfs remove/rescan, reset, aer_inject
# at the port above an nvme), so they must run and pass, not skip.
MUST_PASS_DESTRUCTIVE = (
    "test_aer01_nonfatal_error_counted_recovered_state_per_policy",
    "test_aer02_fatal_error_link_reset_then_recovered_or_faulted",
    "test_rst01_requested_reset_of_healthy_device_within_budget",
    "test_removal_without_warning_is_detected_on_any_host",
    "test_a_device_brought_back_is_discovered_on_any_host",
)


def junit_counts(junit: Path) -> dict[str, int]:
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    return {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}


def test_destructive_suites_pass_and_every_device_comes_back(stand_in, tmp_path):
    """The suites' tests that change the host (--changing-only: the part the read-only run above
    skipped or left out) with --allow-destructive (slow ones left to lab runs, as read-only): no
    error, no failure; what the stand-in offers runs; every device is back afterwards."""

    def devices() -> str:
        return stand_in.ssh("for d in /sys/bus/pci/devices/*; do echo ${d##*/} "
                            "$(basename $(readlink $d/driver 2>/dev/null) 2>/dev/null); done").stdout

    before = devices()
    journal = tmp_path / "journal.jsonl"
    junit = tmp_path / "junit.xml"
    # The DP suite has a test of its own below (all of it here would add ~9 min under TCG).
    done = run_suites(stand_in, "suites", "-m", "not slow", "--changing-only", "--allow-destructive",
                      "--real-journal", str(journal), f"--junitxml={junit}", "--ignore=suites/deviceplugin")
    assert done.returncode == 0, outcome(done)
    properties = {p.get("name"): p.get("value") for p in ElementTree.parse(junit).getroot().iter("property")}
    assert properties.get("runtime") == "hilconform-reference", properties
    counts = junit_counts(junit)
    assert counts["errors"] == 0 and counts["failures"] == 0, (counts, outcome(done))
    passed = passed_tests(junit)
    for must_pass in MUST_PASS_DESTRUCTIVE:
        assert must_pass in passed, f"{must_pass} did not pass:\n{outcome(done)}"
    actions = journal.read_text()
    for action in ("remove", "reset", "aer-inject"):
        assert f'"action": "{action}"' in actions, actions
    assert "0000:00:02.0" not in actions and "0000:00:06.0" not in actions, (
        f"the boot disk or the SSH NIC was touched:\n{actions}")
    assert devices() == before


# A clause's test run through the real-host backend against a mutant that breaks the clause
# (tests/mutants/, deployed over SSH with --runtime-module): it must fail there, not pass or error.
REAL_PATH_MUTANTS = [
    ("suites/aer/test_aer01_nonfatal.py::test_aer01_nonfatal_error_counted_recovered_state_per_policy",
     "recovery_taken_as_failed", "FAULTED"),
    ("suites/discovery/test_disc02_hot_add_latency.py::test_a_device_brought_back_is_discovered_on_any_host",
     "slow_discovery", "brought_back_discovery"),
    ("suites/discovery/test_disc05_identity.py::test_fingerprints_survive_a_runtime_restart",
     "unstable_fingerprint", "fingerprints changed across a runtime restart"),
]


@pytest.mark.parametrize("test, mutant, says", REAL_PATH_MUTANTS, ids=[m for _, m, _ in REAL_PATH_MUTANTS])
def test_a_mutant_fails_its_clause_through_the_real_host_backend(stand_in, tmp_path, test, mutant, says):
    junit = tmp_path / "junit.xml"
    done = run_suites(stand_in, test, "--allow-destructive", "--runtime-module",
                      f"hilconform.tests.mutants.{mutant}", "--real-journal", str(tmp_path / "journal.jsonl"),
                      f"--junitxml={junit}")
    assert done.returncode == 1, outcome(done)
    assert junit_counts(junit) == {"tests": 1, "failures": 1, "errors": 0, "skipped": 0}, outcome(done)
    assert says in done.stdout, outcome(done)
    properties = {p.get("name"): p.get("value") for p in ElementTree.parse(junit).getroot().iter("property")}
    assert properties.get("runtime") == mutant, f"the host ran {properties.get('runtime')!r}, not {mutant}"


def test_real01_fails_when_the_profile_demands_a_faster_link(stand_in, tmp_path):
    demanding = tmp_path / "demanding.toml"
    source = (ROOT / "fixtures/real_profiles/emulated-guest.toml").read_text()
    demanding.write_text(source.replace("link_min = { generation = 1, width = 1 }",
                                        "link_min = { generation = 3, width = 16 }"))
    done = run_suites(stand_in, "suites/real/test_real01_link.py", profile=str(demanding))
    assert done.returncode == 1, outcome(done)
    assert "[major]" in done.stdout and "the model needs Gen3 x16" in done.stdout, outcome(done)


def test_boot_disk_and_ssh_link_are_protected_even_when_destructive(stand_in, tmp_path):
    """The survey finds the root disk (00:02.0) and the SSH NIC (00:06.0); actions on them are refused."""
    runner = SshRunner("127.0.0.1", "root", stand_in.ssh_port, str(stand_in.ssh_config))
    host = RealHost(runner, "emulated-guest", True, tmp_path / "journal.jsonl", name="stand-in")
    try:
        host.preflight()
        protected = host.policy.protected
        assert any("mounted at /" in why for why in protected.get("0000:00:02.0", [])), protected
        assert any("SSH session" in why for why in protected.get("0000:00:06.0", [])), protected
        assert "0000:00:06.0" not in host.policy.safe_targets()
        for bdf in ("0000:00:02.0", "0000:00:06.0"):
            with pytest.raises(UnsafeTarget, match=bdf):
                host.sysfs_remove(bdf)
        assert host.journal.entries == []
        assert stand_in.ssh("test -e /sys/bus/pci/devices/0000:00:06.0/driver").returncode == 0
    finally:
        assert host.close() == []


NAIVE_PLUGIN = ROOT / "tests/plugins/naive_static_plugin.py"
# The DP tests a real host runs with the reference front end in CI: a removal without warning and
# the rescan back (each put back after the test), Allocate; registration, inventory and a kubelet
# restart run through the real-host path with the third-party plugin below. (The whole suite on
# the stand-in, 2026-12-02: 8 passed, 5 skipped with reasons, 9.5 min.)
DP_ON_A_REAL_HOST = (
    "test_a_device_removed_without_warning_is_dropped_or_unhealthy",
    "test_a_device_back_in_its_slot_is_healthy_again_under_its_id",
    "test_allocate_answers_existing_nodes_and_refuses_unknown_ids",
)


def _stand_in_leftovers(stand_in: StandInHost) -> str:
    """What a DP run could leave on the host: the stand-in's folder, the mount point it made, its
    processes or a plugin's, a bind mount. (Each pattern bracketed: the shell running it must not
    match itself.)"""
    return stand_in.ssh("ls -d /tmp/hilconform-kubele[t].* /var/lib/kubelet/device-plugins 2>/dev/null; "
                        "pgrep -af '[k]ubelet_stand_in|[n]aive_static_plugin|[h]ilconform-kubelet"
                        "|[p]ciwatch'; "
                        "grep device-plugins /proc/mounts; ls /sys/fs/cgroup | grep hilconform-plugin; "
                        "true").stdout


# make test-extended: the gate proves the DP suite through the real-host backend with the
# third-party plugin below (registration, inventory, a kubelet restart) and the front end's
# removal and return on emulated hosts; this run adds them on a real host (~65 s under TCG).
@pytest.mark.extended
def test_the_reference_front_end_is_certified_on_a_real_host_and_nothing_stays(stand_in, tmp_path):
    before = _stand_in_leftovers(stand_in)
    devices = stand_in.ssh("ls /sys/bus/pci/devices").stdout
    junit = tmp_path / "junit.xml"
    done = run_suites(stand_in, "suites/deviceplugin", "--allow-destructive",
                      "-k", " or ".join(DP_ON_A_REAL_HOST), "--real-journal", str(tmp_path / "journal.jsonl"),
                      f"--junitxml={junit}")
    assert done.returncode == 0, outcome(done)
    assert passed_tests(junit) == set(DP_ON_A_REAL_HOST), outcome(done)
    assert _stand_in_leftovers(stand_in) == before
    assert stand_in.ssh("ls /sys/bus/pci/devices").stdout == devices


def test_a_third_party_plugin_is_certified_through_a_private_mount_namespace(stand_in, tmp_path):
    """A plugin that hard-codes /var/lib/kubelet/device-plugins (tests/plugins/naive_static_plugin.py)
    runs on the real host in a private mount namespace where the stand-in's temporary folder is
    bound at that path: it registers and lists (DP-02 passes) and, never re-registering, fails
    DP-08. Nothing stays: no process, no folder, no mount point the run made."""
    before = _stand_in_leftovers(stand_in)
    junit = tmp_path / "junit.xml"
    done = run_suites(stand_in, "suites/deviceplugin/test_dp02_inventory.py",
                      "suites/deviceplugin/test_dp08_kubelet_restart.py", "--allow-destructive",
                      "--device-plugin", f"{NAIVE_PLUGIN} hilconform.io/nvme 1b36:0010",
                      "--device-plugin-resource", "hilconform.io/nvme=1b36:0010", f"--junitxml={junit}",
                      "--real-journal", str(tmp_path / "journal.jsonl"))
    assert done.returncode == 1, outcome(done)
    assert junit_counts(junit) == {"tests": 2, "failures": 1, "errors": 0, "skipped": 0}, outcome(done)
    assert passed_tests(junit) == {"test_advertised_devices_are_the_managed_ones_healthy_with_stable_ids"}
    assert _stand_in_leftovers(stand_in) == before


def test_a_plugin_image_runs_under_the_hosts_own_oci_runtime_and_nothing_stays(stand_in, pciwatch, tmp_path):
    """A container image on a real host (issue 33): run by the OCI runtime the host has (the
    guest's crun; the stand-in mounts cgroup2 as a real host's init does), its manifest's plugin
    directory bound from the stand-in's folder. pciwatch keeps to DP-02 and DP-08: both pass. The
    watchdog ends the container: no process, container state, cgroup or folder stays."""
    stand_in.ssh("grep -qs ' /sys/fs/cgroup cgroup2 ' /proc/mounts "
                 "|| mount -t cgroup2 cgroup2 /sys/fs/cgroup")
    before = _stand_in_leftovers(stand_in)
    pod = pciwatch_pod(tmp_path / "pod.yaml", ["--resource", "hilconform.io/nvme", "--ids", "1b36:0010"],
                       host_paths=("/var/lib/kubelet/device-plugins", "/sys"))
    junit = tmp_path / "junit.xml"
    done = run_suites(stand_in, "suites/deviceplugin/test_dp02_inventory.py",
                      "suites/deviceplugin/test_dp08_kubelet_restart.py", "--allow-destructive",
                      "--device-plugin-image", str(pciwatch["oci"]), "--device-plugin-manifest", str(pod),
                      "--device-plugin-resource", "hilconform.io/nvme=1b36:0010", f"--junitxml={junit}",
                      "--real-journal", str(tmp_path / "journal.jsonl"))
    assert done.returncode == 0, outcome(done)
    assert junit_counts(junit) == {"tests": 2, "failures": 0, "errors": 0, "skipped": 0}, outcome(done)
    assert _stand_in_leftovers(stand_in) == before


def test_a_64_mib_plugin_is_streamed_to_a_real_host_over_ssh(stand_in, tmp_path):
    """A real host's path for a plugin of any size (issue 33): the file streamed as ssh's stdin
    (remote_command.put_file), never whole in memory, byte for byte."""
    local = tmp_path / "plugin"
    with local.open("wb") as out:
        for _ in range(64):
            out.write(os.urandom(1 << 20))
    runner = SshRunner("127.0.0.1", user="root", port=stand_in.ssh_port, ssh_config=str(stand_in.ssh_config))
    runner.connect()
    remote = "/tmp/hilconform-big-plugin"
    try:
        put_file(runner, local, remote)
        got = runner.run(["sha256sum", remote], timeout_s=120).check().stdout.split()[0]
        assert got == hashlib.sha256(local.read_bytes()).hexdigest()
        assert runner.run(["test", "-x", remote]).exit_code == 0
    finally:
        runner.run(["rm", "-f", remote])
        runner.close()
