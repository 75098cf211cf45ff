"""The certificate counts a test against a clause its call also found broken (the run record's
`also_failed`, from the user property fixtures/clauses.py ALSO_FAILED_PROPERTY: LIFE-01, which
fixtures/transition_watch.py checks on every test's events)."""

from __future__ import annotations

from recorded_runs import DISC01, recorded_run, rewrite_progress

from hilconform.reports import certificate


def test_the_certificate_counts_a_test_against_the_clause_it_also_failed(tmp_path):
    run = recorded_run(tmp_path)

    def edit(record):
        if record.get("kind") == "test" and record["nodeid"] == DISC01:
            return {**record, "outcome": "failed", "message": "LIFE-01: 1 transition violation(s)",
                    "also_failed": ["LIFE-01"]}
        return record

    rewrite_progress(run, edit)
    cert = certificate.build(run)
    verdicts = {c["id"]: c["verdict"] for c in cert["clauses"]}
    assert verdicts["LIFE-01"] == "fail" and verdicts["DISC-01"] == "fail"
    life01 = next(c for c in cert["clauses"] if c["id"] == "LIFE-01")
    assert [t["nodeid"] for t in life01["tests"]] == [DISC01]
    assert cert["verdict"] == "nonconformant"


def test_a_test_failed_by_the_watch_alone_passes_its_own_clause(tmp_path):
    """Its own checks passed; only LIFE-01's watch failed it: DISC-01 passes, LIFE-01 fails."""
    run = recorded_run(tmp_path)

    def edit(record):
        if record.get("kind") == "test" and record["nodeid"] == DISC01:
            return {**record, "outcome": "failed", "message": "LIFE-01: 1 transition violation(s)",
                    "also_failed": ["LIFE-01"], "own_clause_passed": True}
        return record

    rewrite_progress(run, edit)
    cert = certificate.build(run)
    verdicts = {c["id"]: c["verdict"] for c in cert["clauses"]}
    assert verdicts["LIFE-01"] == "fail" and verdicts["DISC-01"] == "pass"
    assert cert["verdict"] == "nonconformant"
