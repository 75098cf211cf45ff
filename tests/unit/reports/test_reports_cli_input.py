"""`hilconform certify` refuses bad input with a clear message and exit 2, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hilconform.emulators.profile import load_profile

CASES = [
    (["--host", "emulated:nonesuch"], "unknown emulated host 'nonesuch'"),
    (["--host", "mars:a100"], "unknown host kind 'mars'"),
    (["--host", "emulated:a100", "--suite", "nonesuch"],
     "unknown suite 'nonesuch' (known: aer, deviceplugin, discovery"),
    (
        ["--host", "emulated:a100", "--suite", "aer", "--clause", "DISC-01"],
        "no test of the chosen suites checks clause DISC-01",
    ),
    (["--host", "emulated:a100", "--workers", "-1"], "--workers -1: must be 0 or more"),
    (["--host", "real:local", "-n", "2"], "a real host runs one runtime, so it is certified with one worker"),
    # nothing listens on port 9 here: ssh's own reason, in one line
    (
        ["--host", "real:ssh://nobody@127.0.0.1:9", "--suite", "real"],
        "host ssh://nobody@127.0.0.1:9 unreachable over SSH: ssh: connect to host 127.0.0.1 port 9",
    ),
]


def _certify(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hilconform.reports", "certify", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("args, message", CASES, ids=[c[1][:30] for c in CASES])
def test_bad_certify_input_exits_2_with_a_clear_message_and_no_run_folder(tmp_path, args, message):
    done = _certify(*args, "--out", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_broken_profile_is_one_line_before_anything_starts(tmp_path):
    """A lab's own profile (HILCONFORM_PROFILE_PATH) with a bad value: exit 2, the file and key named in
    one line, no run folder and no VM (before: the run started and every test ended 'broken')."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shipped = (Path(load_profile("a100-stock").source)).read_text()
    (profiles / "lab-broken.toml").write_text(
        shipped.replace('hotplug_mode = "native"', 'hotplug_mode = "warp"')
    )
    assert "warp" in (profiles / "lab-broken.toml").read_text()
    out = tmp_path / "runs"
    done = _certify(
        "--host", "emulated:lab-broken", "--out", str(out), env={"HILCONFORM_PROFILE_PATH": str(profiles)}
    )
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("hilconform: error:")]
    assert len(errors) == 1 and "lab-broken.toml" in errors[0] and "host.hotplug_mode" in errors[0], (
        done.stderr
    )
    assert not out.exists()


def test_an_out_folder_that_cannot_be_made_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = _certify("--host", "emulated:a100", "--suite", "reset", "--out", str(blocker / "runs"))
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
