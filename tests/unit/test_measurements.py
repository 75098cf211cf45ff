"""Summaries of measured figures and the clause registry."""

from __future__ import annotations

import pytest

from hilconform.fixtures.clauses import known_clauses
from hilconform.fixtures.measurements import percentile, summarise


def test_summary_figures_and_budget():
    values = [float(v) for v in range(1, 21)]  # 1..20
    summary = summarise("DISC-02", "latency", values, "ms", budget=18, budget_stat="p95")
    assert (summary.min, summary.median, summary.p95, summary.max, summary.n) == (1, 10.5, 19, 20, 20)
    assert summary.within_budget is False
    assert "MISSED" in summary.text()


def test_percentile_is_a_real_sample():
    assert percentile([5.0, 1.0, 3.0], 0.95) == 5.0
    assert percentile([2.0], 0.5) == 2.0


def test_no_samples_is_an_error():
    with pytest.raises(ValueError, match="no samples"):
        summarise("DISC-02", "latency", [], "ms")


def test_spec_lists_every_clause_of_the_requirements():
    clauses = known_clauses()
    for area, count in {"DISC": 6, "LIFE": 6, "HP": 6, "AER": 3, "RST": 3}.items():
        assert [c for c in clauses if c.startswith(area + "-")] == [
            f"{area}-{i:02d}" for i in range(1, count + 1)
        ]


def test_unknown_clause_marker_is_a_usage_error(pytester_like_tmp):
    result = pytester_like_tmp
    assert result.returncode == 4
    assert "clause('NOPE-01',)" in result.stderr


@pytest.fixture
def pytester_like_tmp(tmp_path):
    import subprocess
    import sys

    (tmp_path / "test_x.py").write_text(
        "import pytest\n@pytest.mark.clause('NOPE-01')\ndef test_x():\n    pass\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hilconform.fixtures.plugin", "--collect-only",
         "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path,
    )
