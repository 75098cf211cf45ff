"""The live progress `hilconform certify` prints from progress.jsonl: a line per test, a clause's
verdict once its last test finished, a failure's reason under its line."""

from __future__ import annotations

import io

from recorded_runs import DISC01, DISC03, recorded_run, rewrite_progress, set_outcome

from hilconform.reports.certify import Progress


def test_progress_prints_tests_then_each_clause_verdict_once_complete(tmp_path):
    run = recorded_run(tmp_path)
    set_outcome(
        run, DISC03, "failed", "AssertionError: DISC-03 cold_discovery: budget max <= 6000 ms: MISSED\nmore"
    )
    out = io.StringIO()
    progress = Progress(run, 2, out, {"DISC-01": [DISC01], "DISC-03": [DISC03]})
    progress.poll()
    progress.poll()  # nothing new: nothing printed twice
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[  1/2] DISC-01  passed   (  27.7 s)  suites/discovery/test_disc01")
    assert lines[1].strip() == "=> DISC-01: pass"
    assert lines[2].startswith("[  2/2] DISC-03  failed")
    assert lines[3].strip() == "failed: AssertionError: DISC-03 cold_discovery: budget max <= 6000 ms: MISSED"
    assert lines[4].strip() == "=> DISC-03: fail"
    assert len(lines) == 5


def test_progress_reads_a_line_written_in_two_pieces_once(tmp_path):
    run = recorded_run(tmp_path)
    text = run.progress.read_text()
    line_start = text.index('{"kind": "test", "nodeid": "' + DISC03)
    cut = line_start + 60  # pytest is in the middle of writing DISC-03's line
    run.progress.write_text(text[:cut])
    out = io.StringIO()
    progress = Progress(run, 2, out)
    progress.poll()
    assert "DISC-01  passed" in out.getvalue() and "DISC-03" not in out.getvalue()
    with run.progress.open("a") as stream:
        stream.write(text[cut:])
    progress.poll()
    assert out.getvalue().count("DISC-03  passed") == 1


def test_progress_names_a_crashed_test_and_closes_clauses_whose_tests_never_reported(tmp_path):
    run = recorded_run(tmp_path)
    set_outcome(run, DISC01, "crashed", "worker 'gw0' crashed while running 'DISC-01 test'")
    rewrite_progress(run, lambda r: None if r.get("kind") == "test" and r["nodeid"] == DISC03 else r)
    out = io.StringIO()
    progress = Progress(run, 2, out, {"DISC-01": [DISC01], "DISC-03": [DISC03]})
    progress.poll()
    progress.finish()
    lines = [line.strip() for line in out.getvalue().splitlines()]
    assert lines[0].startswith("[  1/2] DISC-01  crashed")
    assert lines[1] == "crashed: worker 'gw0' crashed while running 'DISC-01 test'"
    assert lines[2] == "=> DISC-01: incomplete"
    assert lines[3] == f"=> DISC-03: not_run (no result from: {DISC03})"
