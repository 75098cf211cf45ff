"""`hilconform certify` end to end, with real VMs: a passing run, a failing run (a runtime that reports
wrong vendor IDs), an infrastructure error (no guest image), Ctrl-C and a pytest-xdist worker killed
mid-test, each checked for its exit code,
its certificate and the run folder's artifacts. Few VM boots: one clause per run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from hilconform.reports.certificate import validate
from hilconform.reports.run_folder import RunFolder

CERTIFY = [sys.executable, "-m", "hilconform.reports", "certify", "--host", "emulated:a100-stock"]
WRONG_VENDOR_RUNTIME = "hilconform.tests.integration.wrong_vendor_runtime"
RUN_DEADLINE_S = 480


def _certify(
    tmp_path: Path, *args: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, RunFolder]:
    out = tmp_path / "runs"
    done = subprocess.run(
        [*CERTIFY, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_S,
        env={**os.environ, **(env or {})},
    )
    folders = list(out.iterdir()) if out.is_dir() else []
    assert len(folders) == 1, f"expected one run folder in {out}: {folders}\n{done.stdout}\n{done.stderr}"
    return done, RunFolder.open(folders[0])


def _allure_results(run: RunFolder) -> list[dict]:
    return [json.loads(p.read_text()) for p in run.allure_results.glob("*-result.json")]


def _labels(result: dict) -> dict[str, str]:
    return {label["name"]: label["value"] for label in result["labels"] if label["name"] != "host"}


def _steps(step_list: list[dict]) -> list[str]:
    return [name for s in step_list for name in (s["name"], *_steps(s.get("steps", [])))]


def test_passing_run_exits_0_with_the_four_artifacts(tmp_path):
    done, run = _certify(
        tmp_path,
        "--suite",
        "discovery",
        "--suite",
        "hotplug",
        "--clause",
        "DISC-01",
        "--clause",
        "HP-01",
        "-n",
        "1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    progress = [line for line in lines if re.match(r"\[\s*\d/4\] (DISC-01|HP-01)\s+passed\s", line)]
    assert len(progress) == 4, done.stdout
    assert lines[-1] == f"hilconform: verdict CONFORMANT (exit 0); run folder {run.path}"
    for artifact in (run.junit, run.allure_results, run.certificate, run.html):
        assert artifact.exists(), artifact
    cert = json.loads(run.certificate.read_text())
    validate(cert)
    assert (cert["verdict"], cert["status"], cert["exit_code"]) == ("conformant", "complete", 0)
    assert [(c["id"], c["verdict"]) for c in cert["clauses"]] == [("DISC-01", "pass"), ("HP-01", "pass")]
    assert cert["devices"] and all(d["driver"] and d["firmware"] and d["link"] for d in cert["devices"])
    assert cert["versions"]["qemu"] and cert["versions"]["guest_kernel"] and cert["versions"]["protocol"] == 1
    assert cert["versions"]["hilconform_checkout"] and cert["versions"]["runtime"] == "hilconform-reference"
    suite = ET.parse(run.junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "0", "0")
    results = {r["fullName"].split("#")[-1]: r for r in _allure_results(run)}
    assert {r["status"] for r in results.values()} == {"passed"}
    result = results["test_boot_inventory_matches_qemu"]
    assert _labels(result) | {
        "epic": "discovery",
        "feature": "DISC-01",
        "severity": "critical",
        "certified_host": "emulated:a100-stock",
        "profile": "a100-stock",
    } == _labels(result)
    # DISC-01 records no step of its own: the worker's host is handed over with its cold discovery
    # complete (saved once ready, docs/emulated-hosts.md), so nothing is waited for. The steps the
    # fixtures record are checked on the removal test.
    removal = _steps(results["test_orderly_removal_by_request"]["steps"])
    assert any(s.startswith("fault: hot_add(") for s in removal), removal
    assert _labels(results["test_orderly_removal_by_request"])["epic"] == "hotplug"
    categories = json.loads((run.allure_results / "categories.json").read_text())
    assert [c["matchedStatuses"] for c in categories][:3] == [["broken"], ["broken"], ["failed"]]
    assert "verdict=conformant" in (run.allure_results / "environment.properties").read_text()
    assert "Verdict: CONFORMANT" in run.html.read_text()


def test_failing_clause_exits_1_and_the_certificate_names_it(tmp_path):
    done, run = _certify(
        tmp_path,
        "--suite",
        "discovery",
        "--clause",
        "DISC-01",
        "-n",
        "0",
        "--runtime-module",
        WRONG_VENDOR_RUNTIME,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        done.stdout.splitlines()[-1] == f"hilconform: verdict NONCONFORMANT (exit 1); run folder {run.path}"
    )
    cert = run.read_certificate()
    assert (cert["verdict"], cert["status"], cert["exit_code"]) == ("nonconformant", "complete", 1)
    [clause] = cert["clauses"]
    assert clause["verdict"] == "fail" and clause["tests"][0]["outcome"] == "failed"
    assert "dead" in clause["tests"][0]["message"]
    assert cert["versions"]["runtime_module"] == WRONG_VENDOR_RUNTIME
    results = _allure_results(run)  # DISC-01's two tests: the node's kernel and QEMU both see 1b36
    assert len(results) == 2 and {r["status"] for r in results} == {"failed"}, results
    for result in results:
        attached = {a["name"] for a in result.get("attachments", [])}
        for name in ("console log", "QMP events", "guest dmesg", "runtime log", "runtime events"):
            assert f"{name} (a100-stock)" in attached, attached
    events = next(a for a in results[0]["attachments"] if a["name"] == "runtime events (a100-stock)")
    assert '"event": "inventory_complete"' in (run.allure_results / events["source"]).read_text()
    suite = ET.parse(run.junit).getroot().find("testsuite")
    assert suite.get("failures") == "2"


def test_infrastructure_error_exits_2_and_is_no_verdict_on_the_clause(tmp_path):
    empty = tmp_path / "no-image"
    empty.mkdir()
    done, run = _certify(
        tmp_path,
        "--suite",
        "discovery",
        "--clause",
        "DISC-01",
        "-n",
        "0",
        env={"HILCONFORM_IMAGE_DIR": str(empty)},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "verdict INCOMPLETE (exit 2)" in done.stdout.splitlines()[-1]
    cert = run.read_certificate()
    assert (cert["verdict"], cert["status"], cert["exit_code"]) == ("incomplete", "incomplete", 2)
    [clause] = cert["clauses"]
    assert clause["verdict"] == "broken" and clause["tests"][0]["outcome"] == "broken"
    assert "guest image incomplete" in clause["tests"][0]["message"]
    results = _allure_results(run)
    assert len(results) == 2, results
    for result in results:
        assert result["status"] == "broken"
        assert "ImageMissing" in result["statusDetails"]["trace"] + result["statusDetails"]["message"]
    assert "Verdict: INCOMPLETE" in run.html.read_text()


def _descendants(root: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_leaves_a_readable_incomplete_run_and_no_processes(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [*CERTIFY, "--out", str(out), "--suite", "discovery", "--clause", "DISC-03", "-n", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[int] = set()
    deadline = time.monotonic() + 180
    try:
        while not any(out.glob("*/progress.jsonl")):  # pytest has started the test (its VM is booting)
            assert proc.poll() is None and time.monotonic() < deadline, "certify never started a test"
            seen |= _descendants(proc.pid)
            time.sleep(0.2)
        time.sleep(3)
        seen |= _descendants(proc.pid)
        assert any("qemu" in Path(f"/proc/{p}/comm").read_text() for p in seen if _alive(p)), (
            "no QEMU was running"
        )
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, stdout + stderr
    assert "SIGINT received" in stderr
    run = RunFolder.open(next(out.iterdir()))
    assert run.read_run()["status"] == "interrupted"
    cert = run.read_certificate()
    assert (cert["verdict"], cert["status"], cert["exit_code"]) == ("incomplete", "incomplete", 2)
    assert "interrupted: SIGINT received" in cert["reasons"]
    assert cert["clauses"][0]["verdict"] != "pass"
    give_up = time.monotonic() + 15
    while (left := [p for p in seen if _alive(p)]) and time.monotonic() < give_up:
        time.sleep(0.2)
    assert not left, f"processes outlived the interrupted run: {left}"


def test_a_worker_killed_mid_test_makes_the_run_incomplete_and_names_the_test(tmp_path):
    """The xdist worker running one of HP-01's two tests is SIGKILLed in its call phase (a real worker,
    a real VM under it); its sibling passes. Before: CONFORMANT, exit 0, HP-01 'pass' on the sibling."""
    killed = "test_hp01_orderly_removal.py::test_orderly_removal_by_request"
    done, run = _certify(
        tmp_path,
        "--suite",
        "hotplug",
        "--clause",
        "HP-01",
        "--",
        "-p",
        "xdist_worker_killer",
        env={
            "HILCONFORM_KILL_WORKER_AT": killed,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])
            ),
        },
    )
    assert done.returncode == 2, done.stdout + done.stderr
    cert = run.read_certificate()
    assert (cert["verdict"], cert["exit_code"]) == ("incomplete", 2)
    hp01 = next(c for c in cert["clauses"] if c["id"] == "HP-01")
    outcomes = {t["nodeid"].split("/")[-1]: t["outcome"] for t in hp01["tests"]}
    assert outcomes[killed] == "crashed", outcomes
    assert "passed" in outcomes.values(), f"the sibling test should have passed: {outcomes}"
    assert hp01["verdict"] == "incomplete"
    crashed = next(t for t in hp01["tests"] if t["outcome"] == "crashed")
    assert "crashed" in crashed["message"], crashed
    assert cert["run"]["unfinished_tests"] == [crashed["nodeid"]]
    assert any(crashed["nodeid"] in r for r in cert["reasons"]), cert["reasons"]
    # the console: the crashed test's own line, the clause not passed, the verdict with the test named
    assert re.search(r"HP-01\s+crashed .*" + re.escape(killed), done.stdout), done.stdout
    assert "=> HP-01: incomplete" in done.stdout
    assert "verdict INCOMPLETE (exit 2)" in done.stdout
    assert crashed["nodeid"] in done.stdout
    # report rebuild reaches the same verdict from the folder's files
    rebuilt = subprocess.run(
        [sys.executable, "-m", "hilconform.reports", "report", "rebuild", str(run.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "verdict INCOMPLETE" in rebuilt.stdout, rebuilt.stdout + rebuilt.stderr
