"""From test outcomes to clause verdicts, the overall verdict, and the exit code.

* A clause **fails** when any of its tests failed (a definitive finding about
  the system under test); this wins over everything else: exit 1.
* A clause is **broken** when a test hit an infrastructure error or crashed in
  its own code, and none failed; **incomplete** when one of its selected tests
  did not finish (`crashed`: the pytest-xdist worker running it died;
  `unfinished`: no final report, e.g. cut short or never started) while others
  did; **inconclusive** when a test found the test bed itself too slow to judge
  the runtime (its measured floor over the profile's limit) and none failed,
  broke or did not finish: neither a pass nor a failure;
  **not_run** when none of its tests reported; **not_checked** when every
  test was skipped (the host lacks a capability) or xfailed; **pass** only
  when every selected test reported, one passed and none failed, broke or did
  not finish.
* Overall: `nonconformant` (exit 1) when a clause failed; else `incomplete`
  (exit 2) when a clause is broken, incomplete, inconclusive or not run, a test did not
  finish (named in the reasons), a test without a clause failed or broke (the
  test bed or the suite's own tooling), pytest itself failed, or the run was
  interrupted; else `partial` (exit 0) when a clause was not checked, said in
  the certificate; else `conformant` (exit 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLAUSE_VERDICTS = ("pass", "fail", "broken", "incomplete", "inconclusive", "not_checked", "not_run")
# Test outcomes that are no result at all: the test did not finish, so nothing it checked counts.
UNFINISHED_OUTCOMES = ("crashed", "unfinished")
OVERALL_VERDICTS = ("conformant", "partial", "nonconformant", "incomplete")
EXIT_CODES = {"conformant": 0, "partial": 0, "nonconformant": 1, "incomplete": 2}
# pytest exit statuses that say the run itself went wrong (internal error, usage error, nothing collected)
PYTEST_TROUBLE = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


def clause_verdict(outcomes: list[str]) -> str:
    """The verdict of a clause from the outcomes of every test selected for it (one entry per test)."""
    if all(o == "unfinished" for o in outcomes):
        return "not_run"
    if "failed" in outcomes or "xpassed" in outcomes:
        return "fail"
    if "broken" in outcomes or "error" in outcomes:
        return "broken"
    if any(o in UNFINISHED_OUTCOMES for o in outcomes):
        return "incomplete"
    if "inconclusive" in outcomes:
        return "inconclusive"
    if "passed" in outcomes:
        return "pass"
    return "not_checked"


@dataclass
class Overall:
    verdict: str
    reasons: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def overall_verdict(
    clauses: dict[str, str],
    other_outcomes: dict[str, str],
    interrupted: str | None,
    pytest_exit: int | None,
    unfinished: list[str] = (),
) -> Overall:
    """`clauses`: clause → verdict; `other_outcomes`: nodeid → outcome of tests naming no clause;
    `unfinished`: the tests of the run's scope that did not finish (crashed, cut short, never run)."""
    reasons = []
    failed = sorted(c for c, v in clauses.items() if v == "fail")
    if failed:
        reasons.append(f"clauses failed: {', '.join(failed)}")
    broken = sorted(c for c, v in clauses.items() if v == "broken")
    if broken:
        reasons.append(f"infrastructure or tooling errors in: {', '.join(broken)}")
    incomplete = sorted(c for c, v in clauses.items() if v == "incomplete")
    if incomplete:
        reasons.append(f"clauses with tests that did not finish: {', '.join(incomplete)}")
    inconclusive = sorted(c for c, v in clauses.items() if v == "inconclusive")
    if inconclusive:
        reasons.append(f"clauses inconclusive (the test bed too slow to judge): {', '.join(inconclusive)}")
    not_run = sorted(c for c, v in clauses.items() if v == "not_run")
    if not_run:
        reasons.append(f"clauses not run: {', '.join(not_run)}")
    if unfinished:
        reasons.append(f"tests did not finish (crashed, cut short or never run): {', '.join(unfinished)}")
    troubled = sorted(
        n
        for n, o in other_outcomes.items()
        if o in ("failed", "broken", "error", "xpassed", *UNFINISHED_OUTCOMES)
    )
    if troubled:
        reasons.append(f"tests without a clause (test bed, tooling) did not pass: {', '.join(troubled)}")
    if interrupted:
        reasons.append(f"interrupted: {interrupted}")
    pytest_trouble = pytest_exit not in (0, 1)
    if pytest_exit is None and not interrupted:
        reasons.append("pytest did not report how it ended")
    elif pytest_trouble and not interrupted:
        why = PYTEST_TROUBLE.get(pytest_exit, "killed" if pytest_exit < 0 else "unexpected status")
        reasons.append(f"pytest ended with status {pytest_exit} ({why})")
    not_checked = sorted(c for c, v in clauses.items() if v == "not_checked")
    if failed:
        return Overall("nonconformant", reasons)
    unsettled = broken or incomplete or inconclusive or not_run or unfinished or troubled
    if unsettled or interrupted or pytest_trouble:
        return Overall("incomplete", reasons)
    if not clauses:
        return Overall("incomplete", reasons + ["no clause was checked"])
    if not_checked:
        return Overall("partial", reasons + [f"clauses not checked (skipped): {', '.join(not_checked)}"])
    return Overall("conformant", reasons)
