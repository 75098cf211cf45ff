"""DISC-03's floor with the runtime held stopped (fixtures/node_clock.py `bare_python_start`
paused_pid): run against a local shell and real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.node_clock import bare_python_start

SPIN = "import time\nwhile True:\n    print(time.monotonic_ns(), flush=True)\n    time.sleep(0.01)\n"


class _LocalNode:
    """A node whose shell is this machine's bash."""

    def shell(self, script: str, timeout_s: float = 30.0):
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout_s)
        return SimpleNamespace(exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_the_runtime_is_stopped_while_the_floor_runs_and_resumed_after():
    runtime = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    try:
        runtime.stdout.readline()
        started_ns, imported_ns = bare_python_start(_LocalNode(), ("json",), paused_pid=runtime.pid)
        assert started_ns <= imported_ns
        assert _state(runtime.pid) != "T"  # resumed
        time.sleep(0.1)
    finally:
        runtime.kill()
        out, _ = runtime.communicate()
    ticks = [int(t) for t in out.split()]
    assert any(t > imported_ns for t in ticks)  # it ran again after the floor
    inside = [t for t in ticks if started_ns + 10_000_000 < t < imported_ns]  # start: 10 ms ticks
    assert not inside, f"the runtime ran while the floor did: {inside}"


def test_a_runtime_that_cannot_be_stopped_is_the_test_beds_error():
    with pytest.raises(InfrastructureError, match="could not stop process"):
        bare_python_start(_LocalNode(), ("json",), paused_pid=2**22 + 12345)
