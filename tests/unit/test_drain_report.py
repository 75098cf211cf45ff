"""The reference runtime's drain reports its deadline arithmetic on its own clock (runtime/procedures.py
`drain`, docs/protocol.md): HP-03 judges give-up less start against the timeout on that clock."""

from __future__ import annotations

import time

from hilconform.fixtures.floor_judgement import TimerReport
from hilconform.runtime.procedures import drain


class _Queue:
    def __init__(self, depths):
        self.depths = list(depths)

    def queue_depth(self, sysfs, bdf):
        return self.depths.pop(0) if len(self.depths) > 1 else self.depths[0]


def test_a_stuck_queue_is_given_up_at_the_deadline_it_reports():
    before = time.monotonic_ns()
    result = drain(_Queue([1]), None, "0000:01:00.0", 0.05, 0.01, lambda: False)
    after = time.monotonic_ns()
    assert result["status"] == "timeout"
    report = TimerReport.of(result)
    assert report is not None
    assert before <= report.started_ns <= report.deadline_ns <= report.gave_up_ns <= after
    assert report.deadline_ns - report.started_ns == 50_000_000
    assert result["elapsed_ms"] == round((report.gave_up_ns - report.started_ns) / 1e6, 3)
    assert result["timeout_ms"] == 50


def test_a_drained_queue_reports_its_start_and_deadline():
    result = drain(_Queue([2, 1, 0]), None, "0000:01:00.0", 1.0, 0.001, lambda: False)
    assert result["status"] == "ok" and result["polls"] == 3
    assert result["deadline_ns"] - result["started_ns"] == 1_000_000_000
    assert "gave_up_ns" not in result
