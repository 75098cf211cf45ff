"""fixtures/run_record.py in a real pytest process: one progress line per test with the right outcome."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

TESTS = """
import pytest
from hilconform.emulators.errors import QemuDied
from hilconform.fixtures.errors import Inconclusive

@pytest.fixture
def crashing():
    raise KeyError("fixture bug")

@pytest.mark.clause("DISC-01")
def test_passes():
    pass

@pytest.mark.clause("DISC-02")
def test_finds_a_problem():
    assert 1 == 2, "latency over budget"

@pytest.mark.clause("DISC-03")
def test_test_bed_breaks():
    raise QemuDied("QEMU exited with status 1")

@pytest.mark.clause("DISC-04")
def test_lacks_capability():
    pytest.skip("host lacks capability 'hotplug'")

@pytest.mark.clause("DISC-06")
def test_test_bed_too_slow():
    raise Inconclusive("the floor was over its limit")

def test_without_clause(crashing):
    pass

@pytest.fixture
def crashing_teardown():
    yield
    raise RuntimeError("teardown bug")

@pytest.mark.clause("DISC-05")
def test_fails_then_its_teardown_crashes(crashing_teardown):
    assert False, "a finding"
"""


def _progress_of(tmp_path, name: str, source: str, *pytest_args: str, exit_status: int = 1) -> list[dict]:
    """Run `source` as test file `name` in a real pytest with --run-dir `tmp_path/run` (exit status 1
    expected unless told: most samples have a test that does not pass); the progress.jsonl lines it
    wrote."""
    (tmp_path / name).write_text(textwrap.dedent(source))
    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "hilconform.fixtures.plugin",
        "-p",
        "no:cacheprovider",
        *pytest_args,
        "--run-dir",
        str(run_dir),
        str(tmp_path / name),
    ]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == exit_status, done.stdout[-3000:]
    return [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]


def test_progress_lines_classify_each_outcome(tmp_path):
    lines = _progress_of(tmp_path, "test_sample.py", TESTS)
    tests = {r["nodeid"].split("::")[1]: r for r in lines if r["kind"] == "test"}
    assert {name: (r["clause"], r["outcome"]) for name, r in tests.items()} == {
        "test_passes": ("DISC-01", "passed"),
        "test_finds_a_problem": ("DISC-02", "failed"),
        "test_test_bed_breaks": ("DISC-03", "broken"),
        "test_lacks_capability": ("DISC-04", "skipped"),
        "test_test_bed_too_slow": ("DISC-06", "inconclusive"),
        "test_without_clause": (None, "error"),
        "test_fails_then_its_teardown_crashes": ("DISC-05", "failed"),
    }
    assert "latency over budget" in tests["test_finds_a_problem"]["message"]
    assert "lacks capability" in tests["test_lacks_capability"]["message"]
    assert tests["test_test_bed_too_slow"]["message"].endswith("Inconclusive: the floor was over its limit")
    assert sum(r["kind"] == "start" for r in lines) == 7
    assert lines[-1] == {**lines[-1], "kind": "session_finish", "exitstatus": 1}
    assert not (tmp_path / "run" / "device-plugin").exists()  # no DP test: no plugin to name


CRASHING_TESTS = """
import os, signal
import pytest

@pytest.mark.clause("HP-01")
def test_worker_dies_under_it():
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.clause("HP-01")
def test_sibling_passes():
    pass
"""


def test_a_test_whose_xdist_worker_dies_gets_a_crashed_line_at_once(tmp_path):
    """A real pytest-xdist worker SIGKILLed mid-test: xdist's crash report (when '???') is the test's
    last word; it is written as `crashed`, with its clause, never dropped for want of a teardown."""
    lines = _progress_of(tmp_path, "test_crash.py", CRASHING_TESTS, "-n", "2")
    tests = {r["nodeid"].split("::")[1]: r for r in lines if r["kind"] == "test"}
    assert {name: (r["clause"], r["outcome"]) for name, r in tests.items()} == {
        "test_worker_dies_under_it": ("HP-01", "crashed"),
        "test_sibling_passes": ("HP-01", "passed"),
    }
    assert "crashed" in tests["test_worker_dies_under_it"]["message"]
    assert lines[-1]["kind"] == "session_finish"


DP_TEST = """
import pytest

@pytest.mark.clause("DP-02")
def test_uses_the_plugin(device_plugin):
    device_plugin.register_versions.add("v1beta1")  # what kubelet_with_plugin keeps of the stand-in's records
"""


def test_a_dp_test_records_the_plugin_it_certified(tmp_path):
    script = tmp_path / "my-plugin"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    given = f"{script} --flag"
    _progress_of(
        tmp_path,
        "test_dp.py",
        DP_TEST,
        "--device-plugin",
        given,
        "--device-plugin-resource",
        "example.com/gpu=10de:20b0",
        exit_status=0,
    )
    recorded = json.loads((tmp_path / "run" / "device-plugin" / "main.json").read_text())
    assert recorded == {
        "kind": "command",
        "command": given,
        "path": str(script.resolve()),
        "sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
        "image": None,
        "resources": [{"name": "example.com/gpu", "device_ids": ["10de:20b0"]}],
        "api_versions": ["v1beta1"],
        "claims": [],
    }
