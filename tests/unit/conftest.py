"""Fixtures shared by the unit tests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def watched_session(tmp_path) -> Callable[[str, str], tuple[dict[str, dict], Path, str]]:
    """Run a pytest session of its own, with the project's plugin and a run folder, on a test file
    written from `source`: (the run record's test lines by test name, the JUnit XML's path, its
    stdout). Why a session of its own: what the whole-life watches report after a test's window
    (fixtures/runtime_life_watch.py, fixtures/plugin_life_watch.py) shows only in a real run's
    reports, never inside the test that asks."""

    def run(source: str, file_name: str) -> tuple[dict[str, dict], Path, str]:
        (tmp_path / file_name).write_text(textwrap.dedent(source))
        junit = tmp_path / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-p", "hilconform.fixtures.plugin", "-p", "no:cacheprovider",
                "-p", "no:xdist", "-rA", "--run-dir", str(tmp_path / "run"), f"--junitxml={junit}",
                str(tmp_path / file_name)]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        lines = [json.loads(line) for line in (tmp_path / "run" / "progress.jsonl").read_text().splitlines()]
        tests = {r["nodeid"].split("::")[1]: r for r in lines if r["kind"] == "test"}
        return tests, junit, done.stdout

    return run
