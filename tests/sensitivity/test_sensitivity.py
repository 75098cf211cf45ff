"""The suites catch broken runtimes (issue 6), checked in this run.

Each mutant of tests/mutants/mutants.toml must be *killed*: a test of the clause it
breaks fails against it. The converse: the reference runtime passes the union of the
same selections. By default the CI subset (`ci = true`: one or two mutants per area);
every mutant with HILCONFORM_SENSITIVITY=full (as `make self-check` does).

Each case runs the self-check (python -m hilconform.reports.self_check) as a process (a pytest run inside
this one would share its plugins and state) into the test's tmp folder and reads the
sensitivity.json it wrote. A run the test bed broke is an error here, not a failure.

The runs certify the emulated host this session's `--host` names (make test: emulated:a100),
so their hosts are restored from the VMs this session's suites saved (the run's shared saved
VMs; a mutant's host is the profile's restored VM with the mutant started as its runtime,
fixtures/fresh_host.py), not booted again. A session on a real host runs them on the
self-check's default host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hilconform.emulators.errors import InfrastructureError
from hilconform.reports.self_check import REFERENCE, load_catalogue, select, union

RUNNER = (sys.executable, "-m", "hilconform.reports.self_check")
FULL = os.environ.get("HILCONFORM_SENSITIVITY", "") == "full"
CHOSEN = select(load_catalogue(), None, full=FULL)
RUN_TIMEOUT_S = 900

pytestmark = pytest.mark.slow


def _host_option(pytestconfig, mutant=None) -> list[str]:
    """Where a run certifies: where the mutant's catalogue entry says it shows, else this
    session's emulated host, else the self-check's default."""
    if mutant is not None and mutant.hosts:
        return ["--host", mutant.hosts[0]]
    host = pytestconfig.getoption("--host")
    return ["--host", host] if host.startswith("emulated:") else []


def _run(args: list[str], out: Path) -> dict:
    argv = [*RUNNER, "--out", str(out), "--jobs", "1",
            "--timeout-s", str(RUN_TIMEOUT_S), *args]
    try:
        subprocess.run(argv, timeout=RUN_TIMEOUT_S + 120, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"self-check {' '.join(args)} ran past its deadline") from None
    report = out / "sensitivity.json"
    if not report.exists():
        raise InfrastructureError(f"self-check {' '.join(args)} wrote no {report}")
    return json.loads(report.read_text())


def _log_tail(out: Path, name: str) -> str:
    log = out / "logs" / f"{name}.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


def _run_in_this_session(request, pytestconfig) -> list[str]:
    """The selection's tests, where this session runs every one of them itself against the
    reference runtime on the host the reference run would use (make test: the suites on
    emulated:a100); else []."""
    if (_host_option(pytestconfig) != ["--host", pytestconfig.getoption("--host")]
            or pytestconfig.getoption("--runtime-module") or pytestconfig.getoption("--device-plugin")):
        return []
    selection = union(CHOSEN)
    in_session = {item.nodeid for item in request.session.items}
    return selection if all(nodeid in in_session for nodeid in selection) else []


# The reference run first: it is the longest, so xdist starts it before the short mutant runs.
def test_reference_runtime_passes_the_same_selection(tmp_path, pytestconfig, request):
    already = _run_in_this_session(request, pytestconfig)
    if already:
        pytest.skip(f"this session runs the selection's {len(already)} tests against the reference "
                    f"runtime on {pytestconfig.getoption('--host')} itself (a failure there fails it)")
    data = _run(["--reference-only", "--mutant", *(m.name for m in CHOSEN), *_host_option(pytestconfig)],
                tmp_path)
    (result,) = data["results"]
    assert result["name"] == REFERENCE
    if result["verdict"] == "broken":
        raise InfrastructureError(f"the reference run could not be judged: {result['why']}\n"
                                  f"{_log_tail(tmp_path, REFERENCE)}")
    assert result["verdict"] == "passed", f"the reference runtime fails the selection: {result['why']}"


@pytest.mark.parametrize("mutant", CHOSEN, ids=lambda m: m.name)
def test_mutant_is_killed_by_the_clause_it_breaks(mutant, tmp_path, pytestconfig):
    on_host = _host_option(pytestconfig, mutant)
    (result,) = _run(["--mutant", mutant.name, "--no-reference", *on_host], tmp_path)["results"]
    if result["verdict"] == "broken":
        raise InfrastructureError(f"mutant {mutant.name} could not be judged: {result['why']}\n"
                                  f"{_log_tail(tmp_path, mutant.name)}")
    assert result["verdict"] == "killed", (
        f"mutant {mutant.name} ({mutant.how}) SURVIVED {' '.join(mutant.tests)}: {result['why']}")
    assert result["caught_by"], result
