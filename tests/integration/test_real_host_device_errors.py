"""A fatal error a device reports itself, through the real-host backend (issue 15's finding).

Real GPUs have their own AER capability, so aer_inject raises an error at the device, not at the
port above it as the emulated hosts' QMP injection does. For a fatal error from an endpoint the
kernel does not read the endpoint's AER registers ("type=Inaccessible"): no aer_dev_* counter
grows, and the runtime must count it from the kernel's "error message received from <device>"
line. The stand-in boots the a100 device models (which have AER) and is reached over SSH, as a
lab host is.

AER-02 passes on the reference runtime and fails on `device_fatal_uncounted` (a runtime that
counts only what the counters show).
"""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

import pytest
from stand_in_real_host import StandInHost, outcome, run_suites, start_stand_in

AER02 = "suites/aer/test_aer02_fatal.py::test_aer02_fatal_error_link_reset_then_recovered_or_faulted"


def _run_aer02(host: StandInHost, tmp_path: Path, *extra: str) -> tuple[dict, str]:
    tmp_path.mkdir()
    junit = tmp_path / "junit.xml"
    done = run_suites(host, AER02, "--allow-destructive", f"--junitxml={junit}",
                      "--real-journal", str(tmp_path / "journal.jsonl"), *extra, profile="a100")
    root = ElementTree.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    return counts, outcome(done)


# make test-extended (~55 s: a model stand-in of its own boots, a VM with sshd is never saved).
# The gate proves AER-02 through the real-host backend on the stock stand-in (the destructive run
# of test_real_host.py); the runtime's counting from the kernel's line has unit tests
# (tests/unit/runtime/test_aer.py, test_service.py).
@pytest.mark.extended
def test_a_fatal_error_a_device_reports_itself_is_counted_and_judged(tmp_path):
    """The reference runtime passes AER-02 there; a runtime counting the counters alone fails it.
    One test, one stand-in: as two tests they landed on both xdist workers, each booting its own
    model stand-in (~14 s; a VM with sshd is never saved)."""
    (tmp_path / "model-stand-in").mkdir()
    host = start_stand_in(tmp_path / "model-stand-in", profile="a100")
    try:
        counts, said = _run_aer02(host, tmp_path / "reference")
        assert counts == {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}, said
        counts, said = _run_aer02(host, tmp_path / "mutant", "--runtime-module",
                                  "hilconform.tests.mutants.device_fatal_uncounted")
        assert counts == {"tests": 1, "failures": 1, "errors": 0, "skipped": 0}, said
        assert "aer counted" in said, said
    finally:
        host.vm.stop()
