"""Model twins of LIFE-02's failing device and REAL-01's link check, on a device-model host (a100).

* The firmware mismatch armed for a hot-added model: the guest reads the armed version from
  the device's first appearance; bad input is refused with the slot left empty; restore_all
  puts the model's own firmware back, and has nothing to undo once the device is removed.
* Each twin fails against a runtime that breaks its clause (a pytest run of the suite test
  with --runtime-module): the mutant that ignores the self-check's verdict (tests/mutants/),
  and a runtime that reports a link's capability as its negotiated link
  (misreported_link_runtime.py).
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from model_vm import restoring_faults, running_vm

from hilconform.emulators.errors import FaultError
from hilconform.emulators.vfio_user.model import load_model
from hilconform.reports.certify import CertifyOptions, _suite_paths, collect_scope

ROOT = Path(__file__).resolve().parents[2]
MODEL_HOST = "a100"
RUN_DEADLINE_S = 300
LIFE02_FAILING = ("suites/lifecycle/test_life02_self_check.py::"
                  "test_device_failing_its_self_check_stays_out_of_the_pool")
REAL01_DEGRADED = ("suites/real/test_real01_model_link.py::"
                   "test_model_link_below_the_minimum_is_a_major_finding")


@pytest.fixture(scope="module")
def vm():
    yield from running_vm(MODEL_HOST)


@pytest.fixture
def faults(vm):
    yield from restoring_faults(vm)


def _firmware_register(faults, slot: str) -> int:
    target = faults._resolve("check", slot)
    return faults.model_registers("check", target, "firmware_version")["firmware_version"]


def test_armed_firmware_mismatch_is_what_the_hot_added_model_reports(vm, faults):
    record = faults.hot_add_with_firmware("spare0", "0.0.1")
    assert record.details["bdf"] and record.details["version"] == "0.0.1"
    assert _firmware_register(faults, "spare0") == 0x000001
    faults.restore_all()
    own = load_model(vm.profile.kind(vm.profile.slot("spare0").accepts).model).firmware
    assert _firmware_register(faults, "spare0") == own.register
    faults.remove_orderly("spare0")
    faults.restore_all()  # the slot is empty again: nothing to undo, no error


def test_armed_firmware_bad_input_is_refused_and_leaves_the_slot_empty(vm, faults):
    with pytest.raises(FaultError, match=r"firmware-mismatch at spare0: '9\.9' is not MAJOR\.MINOR\.PATCH"):
        faults.hot_add_with_firmware("spare0", "9.9")
    assert faults._resolve("check", "spare0", need_device=False).device is None
    assert "spare0" not in vm.models.servers
    with pytest.raises(FaultError, match="hot-add needs an empty slot; it holds gpu0"):
        faults.hot_add_with_firmware("gpu0")


def _suite_run(nodeid: str, runtime_module: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", nodeid, "-n", "0", "-p", "no:cacheprovider", "--host",
         f"emulated:{MODEL_HOST}", "--runtime-module", runtime_module, "--junitxml", str(tmp_path / "j.xml")],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_DEADLINE_S)


def _failed_with(done: subprocess.CompletedProcess, message: str) -> None:
    """The one test FAILED (a finding, not an error) with a message only the broken runtime causes."""
    out = done.stdout + done.stderr
    suite = ET.parse(done.args[done.args.index("--junitxml") + 1]).getroot().find("testsuite")
    counts = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert done.returncode == 1 and counts == ("1", "1", "0", "0"), f"{counts}\n{out[-4000:]}"
    assert message in out, out[-4000:]


def test_life02_twin_fails_a_runtime_that_ignores_the_self_check(tmp_path):
    done = _suite_run(LIFE02_FAILING, "hilconform.tests.mutants.ignores_failed_self_check", tmp_path)
    _failed_with(done, "the self-check passed despite the firmware mismatch")
    assert "running mutant 'ignores_failed_self_check'" in done.stdout, done.stdout[-4000:]


def test_real01_twin_fails_a_runtime_that_misreports_the_link(tmp_path):
    # The reference reads Link Status (5.0 GT/s x8 after the degradation); only a runtime that
    # reports Link Capabilities says 16.0 GT/s x16.
    done = _suite_run(REAL01_DEGRADED, "hilconform.tests.integration.misreported_link_runtime", tmp_path)
    _failed_with(done, "the runtime does not report the degraded link: 0000:01:00.0: runtime reports "
                       "16.0 GT/s x16, sysfs says 5.0 GT/s x8")


def test_certify_of_a_model_host_covers_real01_through_the_twin():
    options = CertifyOptions(host=f"emulated:{MODEL_HOST}", clauses=["REAL-01"])
    scope = collect_scope(options, _suite_paths(options))
    twin = "suites/real/test_real01_model_link.py::"
    assert scope["tests"] == [f"{twin}test_model_links_meet_the_real_cards_minimum", REAL01_DEGRADED]
    real = CertifyOptions(host="real:local", clauses=["REAL-01"])
    assert "suites/real" in _suite_paths(real) and not any("model" in p for p in _suite_paths(real))
    stock = _suite_paths(CertifyOptions(host="emulated:a100-stock"))  # the twin would only skip there
    assert "suites/real" not in stock and not any("model" in p for p in stock), stock
