"""The local command runner (`--host real:local`): results, deadlines, the watchdog session."""

from __future__ import annotations

import time

import pytest

from hilconform.fixtures.remote_command import LocalRunner, RemoteCommandError


@pytest.fixture
def runner():
    local = LocalRunner()
    yield local
    local.close()


def test_results_carry_exit_status_and_output(runner):
    done = runner.shell("echo out; echo err >&2; exit 3")
    assert (done.exit_code, done.stdout, done.stderr) == (3, "out\n", "err\n")
    with pytest.raises(RemoteCommandError, match="exited 3: err"):
        done.check()
    assert runner.run(["cat"], input=b"piped").stdout == "piped"


def test_a_command_past_its_deadline_is_an_error_that_says_so(runner):
    started = time.monotonic()
    with pytest.raises(RemoteCommandError, match="did not finish within 1s"):
        runner.shell("sleep 30", timeout_s=1)
    assert time.monotonic() - started < 10


def test_a_spawned_session_ends_when_its_stdin_closes(runner):
    marker = runner.folder / "ended"
    session = runner.spawn(f"cat > /dev/null; touch {marker}", runner.folder / "session.log")
    time.sleep(0.2)
    assert session.poll() is None and not marker.exists()
    session.stdin.close()
    assert session.wait(timeout=10) == 0
    assert marker.exists()
