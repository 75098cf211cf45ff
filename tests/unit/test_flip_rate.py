"""The flip-rate benchmark's judgement (benchmarks/flip_rate.py, benchmarks/certify_runs.py), without
a VM: reading a certify run's certificate.json, when a run is incomplete (crashed, stopped, no
certificate: never a pass), which clauses flipped and why, the totals and the reports; and that
the benchmark's children (a stand-in for certify, hogs) are its own and are ended.

The certificates are small synthetic ones shaped as reports/certificate.py builds them (verdicts
from reports/verdicts.py), checked against the shipped schema."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hilconform.reports.certificate import validate
from hilconform.reports.verdicts import clause_verdict, overall_verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import certify_runs  # noqa: E402
import flip_rate  # noqa: E402
from certify_runs import CertifyRun  # noqa: E402

A100 = "emulated:a100"
STOCK = "emulated:a100-stock"
PASSED = {"DISC-02": ["passed", "passed"], "HP-03": ["passed"], "LIFE-03": ["passed"]}


def certificate(host: str, outcomes: dict[str, list[str]], messages: dict[str, str] | None = None) -> dict:
    """A certificate as reports/certificate.py writes it: clause -> its tests' outcomes (a test's
    message from `messages`, by clause, for the tests that did not pass)."""
    messages = messages or {}
    clauses = []
    for clause, results in outcomes.items():
        area = clause.split("-")[0].lower()
        tests = [
            {
                "nodeid": f"suites/{area}/test_{clause.lower().replace('-', '')}.py::test_it[{i}]",
                "outcome": outcome,
                "duration_s": 1.5,
                "message": "" if outcome == "passed" else messages.get(clause, f"{outcome} here"),
            }
            for i, outcome in enumerate(results)
        ]
        clauses.append(
            {
                "id": clause,
                "statement": "",
                "verdict": clause_verdict(results),
                "tests": tests,
                "figures": [],
                "preconditions": [],
            }
        )
    overall = overall_verdict({c["id"]: c["verdict"] for c in clauses}, {}, None, 0)
    cert = {
        "schema_version": 1,
        "kind": "hilconform-certificate",
        "status": "incomplete" if overall.verdict == "incomplete" else "complete",
        "verdict": overall.verdict,
        "exit_code": overall.exit_code,
        "reasons": overall.reasons,
        "run": {
            "id": "20261204-101010-x",
            "started": "2026-12-04T10:10:10Z",
            "finished": "2026-12-04T10:12:10Z",
            "duration_s": 120.0,
            "suites": ["suites/discovery"],
            "clauses_selected": [],
            "workers": 3,
            "interrupted": None,
            "pytest_exit": 0,
            "pytest_argv": [],
            "unfinished_tests": [],
            "tests": {"passed": 3},
        },
        "host": {
            "spec": host,
            "profile": host.split(":")[1],
            "description": None,
            "hotplug_mode": "native",
            "accel": "tcg",
            "instances": [],
            "budgets": {},
        },
        "versions": {
            "hilconform": "0.1.0",
            "python": "3.11.2",
            "pytest": "8.3.0",
            "qemu": "10.1.0",
            "guest_kernel": "6.1.0",
            "runtime": "hilconform-reference",
            "runtime_version": "0.1.0",
            "protocol": 1,
            "runtime_module": None,
        },
        "device_plugin": None,
        "devices": [],
        "clauses": clauses,
        "other_tests": [],
        "sensitivity": None,
    }
    validate(cert)
    return cert


def write_run(out: Path, cert: dict | None, name: str = "20261204-101010-emulated-a100") -> Path:
    """The run folder certify leaves under its --out: run.json, and certificate.json unless None."""
    folder = out / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": name}))
    if cert is not None:
        (folder / "certificate.json").write_text(json.dumps(cert, indent=1))
    return folder


def run_of(
    tmp_path: Path, index: int, cert: dict | None, host: str = A100, exit_code=None, **kw
) -> CertifyRun:
    out = tmp_path / f"run-{index:02d}-{host.replace(':', '-')}"
    write_run(out, cert)
    code = exit_code if exit_code is not None else (cert["exit_code"] if cert else 2)
    measured = dict(started="2026-12-04T10:00:00Z", seconds=120.0 + index, load_start=0.5, load_end=2.5)
    return CertifyRun.read(host, index, out, exit_code=code, **{**measured, **kw})


# -- reading certificates ------------------------------------------------------------------------


def test_a_run_folder_and_its_certificate_are_read(tmp_path):
    cert = certificate(A100, PASSED)
    folder = write_run(tmp_path, cert)
    assert certify_runs.read_certificate(tmp_path) == (folder, cert, None)


def test_no_run_folder_no_certificate_or_a_torn_one_is_no_certificate(tmp_path):
    assert certify_runs.read_certificate(tmp_path / "a") == (None, None, "no run folder")
    folder = write_run(tmp_path / "b", None)
    assert certify_runs.read_certificate(tmp_path / "b") == (folder, None, "no certificate.json")
    folder = write_run(tmp_path / "c", None)
    (folder / "certificate.json").write_text('{"schema_version": 1, "clau')
    found, cert, why = certify_runs.read_certificate(tmp_path / "c")
    assert (found, cert) == (folder, None) and why.startswith("certificate.json unreadable")


def test_a_certificate_off_the_schema_is_no_certificate(tmp_path):
    cert = certificate(A100, PASSED)
    cert["clauses"][0]["verdict"] = "passed-ish"
    _, found, why = certify_runs.read_certificate(write_run(tmp_path, cert).parent)
    assert found is None and "certificate.json at clauses/0/verdict" in why


# -- incomplete runs -----------------------------------------------------------------------------


def test_a_conformant_run_is_conformant(tmp_path):
    run = run_of(tmp_path, 1, certificate(A100, PASSED))
    assert (run.verdict, run.problem, run.reasons) == ("conformant", None, [])
    assert run.clause_verdicts() == {"DISC-02": "pass", "HP-03": "pass", "LIFE-03": "pass"}


@pytest.mark.parametrize(
    "exit_code, kw, cert_host, problem",
    [
        (-9, {}, None, "no certificate.json (certify exit -9)"),
        (0, {"stopped": "ran past the benchmark's deadline (35.0 min)"}, A100,
         "stopped by the benchmark: ran past the benchmark's deadline (35.0 min) (exit 0)"),
        (3, {}, A100, "certify exited 3; its certificate says 0"),
        (0, {}, STOCK, f"its certificate is for {STOCK}, not {A100}"),
    ],
    ids=["crashed-no-certificate", "timed-out", "exit-mismatch", "other-host"],
)
def test_a_run_that_crashed_timed_out_or_disagrees_is_incomplete_never_a_pass(
    tmp_path, exit_code, kw, cert_host, problem
):
    cert = certificate(cert_host, PASSED) if cert_host else None
    run = run_of(tmp_path, 1, cert, exit_code=exit_code, **kw)
    assert run.verdict == "incomplete"
    assert run.problem == problem and run.reasons[0] == problem
    assert run.summary()["verdict"] == "incomplete"


# -- flips and their reasons ---------------------------------------------------------------------


def test_the_same_pass_in_every_run_is_no_flip(tmp_path):
    runs = [run_of(tmp_path, i, certificate(A100, PASSED)) for i in (1, 2, 3)]
    assert flip_rate.find_flips(runs) == []


def test_a_clause_that_failed_once_flips_with_the_test_message_and_run_folder(tmp_path):
    failing = {**PASSED, "DISC-02": ["passed", "failed"]}
    message = "AssertionError: storm device 833 ms after device_add\nassert 833 <= 750"
    runs = [
        run_of(tmp_path, 1, certificate(A100, PASSED)),
        run_of(tmp_path, 2, certificate(A100, failing, {"DISC-02": message})),
        run_of(tmp_path, 3, certificate(A100, PASSED)),
    ]
    (flip,) = flip_rate.find_flips(runs)
    assert (flip.host, flip.clause, flip.verdicts) == (A100, "DISC-02", ["pass", "fail", "pass"])
    (reason,) = flip.reasons
    assert reason["run"] == 2 and reason["verdict"] == "fail"
    assert reason["folder"] == str(runs[1].folder)
    assert reason["why"] == (
        "test_disc02.py::test_it[1]: failed: AssertionError: storm device 833 ms after device_add "
        "assert 833 <= 750"
    )
    assert reason["tests"] == [
        {"nodeid": "suites/disc/test_disc02.py::test_it[1]", "outcome": "failed", "message": message}
    ]


def test_a_non_pass_in_every_run_flips_for_the_reference_runtime_only(tmp_path):
    inconclusive = {**PASSED, "LIFE-03": ["inconclusive"]}
    runs = [run_of(tmp_path, i, certificate(A100, inconclusive, {"LIFE-03": "floor 180 ms"})) for i in (1, 2)]
    (flip,) = flip_rate.find_flips(runs)
    assert flip.clause == "LIFE-03" and flip.verdicts == ["inconclusive", "inconclusive"]
    assert [r["why"] for r in flip.reasons] == ["test_life03.py::test_it[0]: inconclusive: floor 180 ms"] * 2
    assert flip_rate.find_flips(runs, reference=False) == []
    changed = [*runs, run_of(tmp_path, 3, certificate(A100, PASSED))]
    assert [f.clause for f in flip_rate.find_flips(changed, reference=False)] == ["LIFE-03"]


def test_a_run_without_certificate_flips_every_clause_with_its_reason(tmp_path):
    runs = [run_of(tmp_path, 1, certificate(A100, PASSED)), run_of(tmp_path, 2, None, exit_code=-9)]
    flips = flip_rate.find_flips(runs)
    assert [f.clause for f in flips] == ["DISC-02", "HP-03", "LIFE-03"]
    for flip in flips:
        assert flip.verdicts == ["pass", "missing"]
        (reason,) = flip.reasons
        assert reason["verdict"] == "missing" and reason["tests"] == []
        assert reason["why"] == "run incomplete: no certificate.json (certify exit -9)"
        assert reason["folder"] == str(runs[1].folder)


def test_a_clause_absent_from_one_certificate_flips(tmp_path):
    fewer = {k: v for k, v in PASSED.items() if k != "HP-03"}
    runs = [run_of(tmp_path, 1, certificate(A100, PASSED)), run_of(tmp_path, 2, certificate(A100, fewer))]
    (flip,) = flip_rate.find_flips(runs)
    assert flip.clause == "HP-03" and flip.verdicts == ["pass", "missing"]
    assert flip.reasons[0]["why"] == "the clause is not in this run's certificate"


def test_a_stopped_run_keeps_its_clause_verdicts_and_names_why_it_is_incomplete(tmp_path):
    cut = {**PASSED, "HP-03": ["unfinished"]}
    cert = certificate(A100, cut, {"HP-03": "did not finish: started, never reported an end"})
    stopped = run_of(tmp_path, 2, cert, stopped="interrupted (Ctrl-C or SIGTERM)", exit_code=-2)
    runs = [run_of(tmp_path, 1, certificate(A100, PASSED)), stopped]
    (flip,) = flip_rate.find_flips(runs)
    assert flip.clause == "HP-03" and flip.verdicts == ["pass", "not_run"]
    assert flip.reasons[0]["why"] == (
        "test_hp03.py::test_it[0]: unfinished: did not finish: started, never reported an end; "
        "run incomplete: stopped by the benchmark: interrupted (Ctrl-C or SIGTERM) (exit -2)"
    )


# -- totals and reports --------------------------------------------------------------------------


def _runs(tmp_path) -> list[CertifyRun]:
    failing = {**PASSED, "DISC-02": ["passed", "failed"]}
    inconclusive = {**PASSED, "LIFE-03": ["inconclusive"]}
    loads = {1: [5.5, 6.0, 6.5], 2: [7.0], 3: [5.0, 4.0, 6.0]}  # medians 6, 7, 5
    return [
        run_of(tmp_path, 1, certificate(A100, PASSED), seconds=120.0, load_samples=loads[1]),
        run_of(tmp_path, 1, certificate(STOCK, PASSED), host=STOCK, seconds=100.0, load_samples=loads[1]),
        run_of(tmp_path, 2, certificate(A100, failing), seconds=180.0, load_samples=loads[2]),
        run_of(tmp_path, 2, certificate(STOCK, inconclusive), STOCK, seconds=110.0, load_samples=loads[2]),
        run_of(tmp_path, 3, certificate(A100, PASSED), seconds=150.0, load_samples=loads[3]),
        run_of(tmp_path, 3, None, host=STOCK, exit_code=-9, seconds=30.0),  # no samples: start and end
    ]


def _report(tmp_path) -> dict:
    meta = {"commit": "7f95b6b", "started": "2026-12-04 10:00 UTC", "finished": "2026-12-04 10:20 UTC",
            "cpus": 2, "mode": "idle (no hogs)", "interrupted": False}
    return flip_rate.build_report(_runs(tmp_path), [A100, STOCK], meta)


def test_totals_count_flips_inconclusive_failed_and_incomplete_runs(tmp_path):
    report = _report(tmp_path)
    a100, stock = report["hosts"]
    assert a100["wall_s"] == {"median": 150.0, "min": 120.0, "max": 180.0}
    assert a100["run_verdicts"] == {"conformant": 2, "nonconformant": 1}
    assert (len(a100["flips"]), a100["failed"], a100["inconclusive"]) == (1, 1, 0)
    assert a100["incomplete_runs"] == []
    assert stock["run_verdicts"] == {"conformant": 1, "incomplete": 2}
    assert stock["clauses"]["LIFE-03"] == ["pass", "inconclusive", "missing"]
    assert stock["incomplete_runs"] == [2, 3]
    assert [f["clause"] for f in stock["flips"]] == ["DISC-02", "HP-03", "LIFE-03"]
    assert report["totals"] == {"runs": 6, "flips": 4, "inconclusive": 1, "failed": 1, "incomplete_runs": 2}


def test_the_report_is_json_text_and_a_markdown_table(tmp_path):
    report = _report(tmp_path)
    md = flip_rate.write_report(report, tmp_path / "out" / "flip-rate.json")
    assert json.loads((tmp_path / "out" / "flip-rate.json").read_text()) == json.loads(json.dumps(report))
    table = md.read_text().splitlines()
    assert table[0].startswith(
        "Flip rate at 7f95b6b (2026-12-04 10:00 UTC - 2026-12-04 10:20 UTC, 2 CPUs, idle"
    )
    assert table[4] == (
        "| emulated:a100 | 3 | 2 conformant, 1 nonconformant | 3 | 2.50 (2.00-3.00) | 6.00 (5.00-7.00) "
        "| 1 | 0 | 1 | 0 |"
    )
    assert table[6] == "| all | 6 | | | | 6.00 (1.50-7.00) | 4 | 1 | 1 | 2 |"
    assert "Under the target load" not in md.read_text()  # an idle series has none
    flip_line = "- emulated:a100 DISC-02 (pass fail pass): run 2 fail: test_disc02.py::test_it[1]: failed"
    assert flip_line in md.read_text()
    text = flip_rate.text_report(report)
    assert "   DISC-02  P F P   <- flip" in text
    assert "   LIFE-03  P ? -   <- flip" in text
    assert "totals: 6 runs, 2 incomplete; flips 4, inconclusive 1, failed 1" in text


def test_runs_whose_median_load_stayed_under_the_target_are_named(tmp_path):
    report = {**_report(tmp_path), "load_target": 6.0}
    every_run = [r for s in report["hosts"] for r in s["runs"]]
    low = flip_rate.below_target(every_run, 6.0)
    assert [(r["host"], r["index"]) for r in low] == [(A100, 3), (STOCK, 3)]
    assert (
        "Under the target load 6: emulated:a100 run 3 (median 5.00), emulated:a100-stock run 3 (median 1.50)"
        in flip_rate.markdown(report)
    )


def test_the_load_sampler_samples_until_the_run_ends():
    with certify_runs.LoadSampler(every_s=0.01) as sampler:
        time.sleep(0.1)
    taken = len(sampler.samples)
    time.sleep(0.05)
    assert taken >= 2 and len(sampler.samples) == taken
    assert all(isinstance(s, float) for s in sampler.samples)


# -- the benchmark's own processes ---------------------------------------------------------------

FAKE_CERTIFY = textwrap.dedent(
    """
    import json, os, pathlib, signal, sys, time
    argv = sys.argv[1:]
    host, out = argv[argv.index("--host") + 1], pathlib.Path(argv[argv.index("--out") + 1])
    if os.environ.get("FAKE_IGNORE_SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    cert = json.loads(os.environ["FAKE_CERTIFICATE"])
    folder = out / "20261204-101010-run"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    (folder / "certificate.json").write_text(json.dumps(cert))
    print("hilconform: verdict", cert["verdict"])
    sys.exit(cert["exit_code"])
    """
)


@pytest.fixture
def fake_certify(tmp_path, monkeypatch):
    script = tmp_path / "fake_certify.py"
    script.write_text(FAKE_CERTIFY)
    monkeypatch.setattr(certify_runs, "CERTIFY", [sys.executable, str(script)])
    monkeypatch.setattr(certify_runs, "POLL_S", 0.05)
    monkeypatch.setattr(certify_runs, "OVERRUN_S", 0.0)
    monkeypatch.setenv("FAKE_CERTIFICATE", json.dumps(certificate(A100, PASSED)))
    return monkeypatch


def test_certify_runs_as_a_child_and_its_certificate_is_read(tmp_path, fake_certify):
    run = certify_runs.certify(A100, tmp_path / "run-01", 1, ["discovery"], max_minutes=1)
    assert (run.exit_code, run.stopped, run.interrupted, run.verdict) == (0, None, False, "conformant")
    assert run.folder == tmp_path / "run-01" / "20261204-101010-run"
    assert (tmp_path / "run-01" / "certify.log").read_text() == "hilconform: verdict conformant\n"


def test_certify_past_its_deadline_is_stopped_and_incomplete(tmp_path, fake_certify):
    fake_certify.setenv("FAKE_SLEEP", "30")
    started = time.monotonic()
    run = certify_runs.certify(A100, tmp_path / "run-01", 1, max_minutes=0.005)
    assert time.monotonic() - started < 10
    assert run.exit_code == -signal.SIGINT and run.stopped.startswith("ran past the benchmark's deadline")
    assert run.verdict == "incomplete" and run.problem.startswith("stopped by the benchmark")


def test_certify_deaf_to_sigint_is_killed_after_the_grace(tmp_path, fake_certify):
    fake_certify.setenv("FAKE_SLEEP", "30")
    fake_certify.setenv("FAKE_IGNORE_SIGINT", "1")
    fake_certify.setattr(certify_runs, "STOP_GRACE_S", 0.3)
    run = certify_runs.certify(A100, tmp_path / "run-01", 1, max_minutes=0.005)
    assert run.exit_code == -signal.SIGKILL and run.verdict == "incomplete"


def _interrupting_clock(times: int):
    """A `time` whose monotonic() raises KeyboardInterrupt (a Ctrl-C) on its 2nd .. times+1-th call."""
    calls = []

    def monotonic():
        calls.append(1)
        if 2 <= len(calls) <= times + 1:
            raise KeyboardInterrupt
        return time.monotonic()

    return SimpleNamespace(monotonic=monotonic, sleep=time.sleep, strftime=time.strftime, gmtime=time.gmtime)


@pytest.mark.parametrize("presses, ignores_sigint", [(1, False), (2, True)], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_ends_the_certify_child_and_is_reported(tmp_path, fake_certify, presses, ignores_sigint):
    fake_certify.setenv("FAKE_SLEEP", "30")
    if ignores_sigint:
        fake_certify.setenv("FAKE_IGNORE_SIGINT", "1")
    fake_certify.setattr(certify_runs, "time", _interrupting_clock(presses))
    code, why, interrupted = certify_runs.run_owned(
        [*certify_runs.CERTIFY, "--host", A100, "--out", str(tmp_path)], tmp_path / "log", 600
    )
    assert interrupted and why == "interrupted (Ctrl-C or SIGTERM)"
    assert code == (-signal.SIGKILL if ignores_sigint else -signal.SIGINT)


def test_hogs_are_own_children_in_their_own_session_and_are_ended():
    hogs = certify_runs.start_hogs(2)
    try:
        assert all(os.getsid(h.pid) == h.pid for h in hogs)
    finally:
        certify_runs.stop_hogs(hogs)
    assert [h.returncode for h in hogs] == [-signal.SIGKILL] * 2
    assert certify_runs.hog_count(0) == 0 and certify_runs.hog_count(6) == 7
