"""From test outcomes to clause verdicts, the overall verdict, and the exit code.

* A clause **fails** when any of its tests failed (a definitive finding about
  the system under test); this wins over everything else: exit 1.
* A clause is **broken** when a test hit an infrastructure error or crashed in
  its own code, and none failed; **not_run** when the run ended before its
  tests ran; **not_checked** when every test was skipped (the host lacks a
  capability) or xfailed; **pass** when a test passed and none failed or broke.
* Overall: `nonconformant` (exit 1) when a clause failed; else `incomplete`
  (exit 2) when a clause is broken or not run, a test without a clause failed
  or broke (the test bed or the suite's own tooling), pytest itself failed,
  or the run was interrupted; else `partial` (exit 0) when a clause was not
  checked, said in the certificate; else `conformant` (exit 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLAUSE_VERDICTS = ("pass", "fail", "broken", "not_checked", "not_run")
OVERALL_VERDICTS = ("conformant", "partial", "nonconformant", "incomplete")
EXIT_CODES = {"conformant": 0, "partial": 0, "nonconformant": 1, "incomplete": 2}
# pytest exit statuses that say the run itself went wrong (internal error, usage error, nothing collected)
PYTEST_TROUBLE = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


def clause_verdict(outcomes: list[str]) -> str:
    if not outcomes:
        return "not_run"
    if "failed" in outcomes or "xpassed" in outcomes:
        return "fail"
    if "broken" in outcomes or "error" in outcomes:
        return "broken"
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
    clauses: dict[str, str], other_outcomes: dict[str, str], interrupted: str | None, pytest_exit: int | None
) -> Overall:
    """`clauses`: clause → verdict; `other_outcomes`: nodeid → outcome of tests naming no clause."""
    reasons = []
    failed = sorted(c for c, v in clauses.items() if v == "fail")
    if failed:
        reasons.append(f"clauses failed: {', '.join(failed)}")
    broken = sorted(c for c, v in clauses.items() if v == "broken")
    if broken:
        reasons.append(f"infrastructure or tooling errors in: {', '.join(broken)}")
    not_run = sorted(c for c, v in clauses.items() if v == "not_run")
    if not_run:
        reasons.append(f"clauses not run: {', '.join(not_run)}")
    troubled = sorted(n for n, o in other_outcomes.items() if o in ("failed", "broken", "error", "xpassed"))
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
    if broken or not_run or troubled or interrupted or pytest_trouble:
        return Overall("incomplete", reasons)
    if not clauses:
        return Overall("incomplete", reasons + ["no clause was checked"])
    if not_checked:
        return Overall("partial", reasons + [f"clauses not checked (skipped): {', '.join(not_checked)}"])
    return Overall("conformant", reasons)
