"""`hilconform certify` refuses bad input with a clear message and exit 2, before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["--host", "emulated:nonesuch"], "unknown emulated host 'nonesuch'"),
    (["--host", "mars:a100"], "unknown host kind 'mars'"),
    (["--host", "emulated:a100", "--suite", "nonesuch"], "unknown suite 'nonesuch' (known: aer, discovery"),
    (
        ["--host", "emulated:a100", "--suite", "aer", "--clause", "DISC-01"],
        "no test of the chosen suites checks clause DISC-01",
    ),
    (["--host", "emulated:a100", "--workers", "-1"], "--workers -1: must be 0 or more"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[c[1][:30] for c in CASES])
def test_bad_certify_input_exits_2_with_a_clear_message_and_no_run_folder(tmp_path, args, message):
    done = subprocess.run(
        [sys.executable, "-m", "hilconform.reports", "certify", *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_out_folder_that_cannot_be_made_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hilconform.reports",
            "certify",
            "--host",
            "emulated:a100",
            "--suite",
            "reset",
            "--out",
            str(blocker / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--out {blocker / 'runs'}: cannot make the run folder there" in done.stderr


def test_help_documents_the_exit_codes():
    done = subprocess.run(
        [sys.executable, "-m", "hilconform.reports", "certify", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    for line in ("0  conformant", "1  nonconformant", "2  incomplete"):
        assert line in done.stdout
