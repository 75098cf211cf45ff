"""docs/spec.md and the suites agree: every clause has a test, every named test exists.

The spec's "Test" column lists node ids; each must be collected and carry the
clause's marker, and every clause must have at least one test. (A test that
names a clause the spec does not know is refused at collection by the plugin.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from hilconform.fixtures.clauses import SPEC, known_clauses

ROOT = Path(__file__).resolve().parent.parent.parent
_ROW = re.compile(r"^\|\s*([A-Z]+-\d{2})\s*\|")


def spec_tests() -> dict[str, list[str]]:
    tests = {}
    for line in SPEC.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            tests[match.group(1)] = re.findall(r"`([^`]+::[^`]+)`", cells[-1])
    return tests


def collected_clauses() -> dict[str, set[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--list-clauses",
         "-p", "no:cacheprovider", "suites"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("clause "):
            _, clause, nodeid = line.split(" ", 2)
            found.setdefault(clause, set()).add(nodeid)
    return found


def test_every_clause_has_a_test_and_the_spec_names_real_tests():
    collected = collected_clauses()
    listed = spec_tests()
    assert set(listed) == set(known_clauses())
    missing = [c for c in known_clauses() if not collected.get(c)]
    assert missing == [], f"clauses without a test: {missing}"
    for clause, nodeids in listed.items():
        assert nodeids, f"docs/spec.md names no test for {clause}"
        for nodeid in nodeids:
            marked = {n.split("[")[0] for n in collected.get(clause, set())}
            assert nodeid.split("[")[0] in marked, (
                f"docs/spec.md says {nodeid} checks {clause}, but no such test carries that clause"
            )
