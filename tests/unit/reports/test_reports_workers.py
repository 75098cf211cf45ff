"""How many pytest workers `hilconform certify` runs, and how it hands them tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from hilconform.reports import certify
from hilconform.reports.run_folder import RunFolder


def _argv(tmp_path: Path, **options) -> list[str]:
    chosen = certify.CertifyOptions(**options)
    chosen.workers = certify.check_workers(chosen)
    return certify._pytest_argv(chosen, RunFolder(tmp_path / "run"), ["suites/aer"])


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_an_emulated_host_gets_the_emulated_worker_count_and_work_stealing(tmp_path):
    argv = _argv(tmp_path, host="emulated:a100")
    assert _option(argv, "-n") == str(certify.EMULATED_WORKERS)
    assert _option(argv, "--dist") == "worksteal"


def test_a_real_host_gets_one_worker_and_no_distribution(tmp_path):
    argv = _argv(tmp_path, host="real:local")
    assert _option(argv, "-n") == "1"
    assert "--dist" not in argv


@pytest.mark.parametrize("workers", [0, 1])
def test_one_worker_or_none_asked_for_gets_no_distribution(tmp_path, workers):
    argv = _argv(tmp_path, host="emulated:a100", workers=workers)
    assert _option(argv, "-n") == str(workers)
    assert "--dist" not in argv
