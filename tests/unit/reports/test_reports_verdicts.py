"""The verdict rules (reports/verdicts.py): per clause from test outcomes, overall with its exit code."""

from __future__ import annotations

import pytest

from hilconform.reports.verdicts import clause_verdict, overall_verdict


@pytest.mark.parametrize(
    "outcomes, verdict",
    [
        ([], "not_run"),
        (["passed"], "pass"),
        (["passed", "skipped"], "pass"),
        (["skipped", "skipped"], "not_checked"),
        (["xfailed"], "not_checked"),
        (["passed", "broken"], "broken"),
        (["passed", "error"], "broken"),
        (["broken", "failed"], "fail"),
        (["passed", "xpassed"], "fail"),
        (["passed", "crashed"], "incomplete"),
        (["passed", "unfinished"], "incomplete"),
        (["skipped", "crashed"], "incomplete"),
        (["unfinished", "unfinished"], "not_run"),
        (["crashed"], "incomplete"),
        (["crashed", "failed"], "fail"),
        (["crashed", "broken"], "broken"),
        (["inconclusive"], "inconclusive"),
        (["passed", "inconclusive"], "inconclusive"),
        (["inconclusive", "failed"], "fail"),
        (["inconclusive", "broken"], "broken"),
        (["inconclusive", "crashed"], "incomplete"),
    ],
)
def test_clause_verdict(outcomes, verdict):
    assert clause_verdict(outcomes) == verdict


@pytest.mark.parametrize(
    "clauses, others, interrupted, pytest_exit, verdict, exit_code",
    [
        ({"DISC-01": "pass"}, {}, None, 0, "conformant", 0),
        ({"DISC-01": "pass", "AER-02": "not_checked"}, {}, None, 0, "partial", 0),
        ({"DISC-01": "fail", "AER-02": "broken"}, {}, None, 1, "nonconformant", 1),
        ({"DISC-01": "fail"}, {}, "SIGINT received", 2, "nonconformant", 1),
        ({"DISC-01": "pass", "AER-02": "broken"}, {}, None, 1, "incomplete", 2),
        ({"DISC-01": "pass"}, {}, "SIGINT received", 2, "incomplete", 2),
        ({"DISC-01": "pass"}, {}, None, 3, "incomplete", 2),
        ({"DISC-01": "pass"}, {}, None, -9, "incomplete", 2),
        ({"DISC-01": "pass"}, {}, None, None, "incomplete", 2),
        ({"DISC-01": "pass"}, {"suites/smoke/test_x.py::test_boots": "failed"}, None, 1, "incomplete", 2),
        ({"DISC-01": "pass"}, {"suites/smoke/test_x.py::test_boots": "skipped"}, None, 0, "conformant", 0),
        ({}, {}, None, 5, "incomplete", 2),
        ({"DISC-01": "pass", "DISC-03": "inconclusive"}, {}, None, 0, "incomplete", 2),
        ({"DISC-02": "fail", "DISC-03": "inconclusive"}, {}, None, 1, "nonconformant", 1),
    ],
)
def test_overall_verdict_and_exit_code(clauses, others, interrupted, pytest_exit, verdict, exit_code):
    overall = overall_verdict(clauses, others, interrupted, pytest_exit)
    assert (overall.verdict, overall.exit_code) == (verdict, exit_code)
    assert overall.reasons or verdict == "conformant"


def test_a_test_that_did_not_finish_makes_the_run_incomplete_and_is_named():
    crashed = "suites/hotplug/test_hp01_orderly_removal.py::test_orderly_removal_by_request"
    overall = overall_verdict({"HP-01": "incomplete", "HP-05": "pass"}, {}, None, 1, [crashed])
    assert (overall.verdict, overall.exit_code) == ("incomplete", 2)
    assert any(crashed in r for r in overall.reasons) and any("HP-01" in r for r in overall.reasons)
    # even when every clause's verdict looks fine, an unfinished test alone is enough
    assert overall_verdict({"HP-05": "pass"}, {}, None, 0, [crashed]).verdict == "incomplete"
    # a definitive failure still wins
    assert overall_verdict({"HP-05": "fail"}, {}, None, 1, [crashed]).verdict == "nonconformant"
    assert overall_verdict({"HP-05": "pass"}, {"suites/smoke/t.py::t": "crashed"}, None, 1).exit_code == 2
