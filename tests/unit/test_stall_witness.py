"""The stall witness (fixtures/stall_witness.py): its program, its log, and stalls within an interval."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.stall_witness import _PROGRAM, GuestStallWitness, NodeStalls, Stall, stalled_ms


class _Node:
    """A node whose shell answers the witness's start, ready check and stop with a given log."""

    def __init__(self, log: str):
        self.log, self.scripts = log, []

    def shell(self, script, timeout_s=30):
        self.scripts.append(script)
        stdout = "4242 /tmp/hilc-witness.x\n" if script.startswith("log=") else self.log
        return subprocess.CompletedProcess(script, 0, stdout=stdout, stderr="")


class _Result(subprocess.CompletedProcess):
    @property
    def exit_code(self):
        return self.returncode


def _node(log):
    node = _Node(log)
    shell = node.shell
    node.shell = lambda script, timeout_s=30: _Result(*vars(shell(script, timeout_s)).values())
    return node


def test_stalls_are_counted_only_where_they_overlap_the_interval():
    stalls = NodeStalls([Stall(0, 100_000_000), Stall(250_000_000, 400_000_000),
                         Stall(900_000_000, 950_000_000)])
    assert stalled_ms(stalls, 50_000_000, 300_000_000) == pytest.approx(50 + 50)
    assert stalled_ms(stalls, 400_000_000, 900_000_000) == 0
    assert stalled_ms(NodeStalls(), 0, 10**9) == 0


def test_the_witness_reads_its_stalls_from_the_log_and_runs_at_raised_priority():
    node = _node("ready 5\n100 200\n300 450\n")
    stalls = GuestStallWitness(node).stop()
    assert stalls == [Stall(100, 200), Stall(300, 450)]
    assert "nice -n -10 python3" in node.scripts[0]
    assert node.scripts[-1].startswith("kill 4242")


def test_a_witness_that_never_said_ready_is_an_infrastructure_error():
    node = _node("Traceback: no python3\n")
    witness = GuestStallWitness.__new__(GuestStallWitness)
    from hilconform.fixtures.node_witness import NodeWitness

    witness._witness = NodeWitness.__new__(NodeWitness)
    witness._witness.host, witness._witness.pid, witness._witness.log = node, 1, "/tmp/x"
    with pytest.raises(InfrastructureError, match="no ready line"):
        witness.stop()


def test_the_program_logs_a_wake_that_came_late():
    """The witness's own program, here: a SIGSTOP of 300 ms is logged as one stall of about that."""
    witness = subprocess.Popen([sys.executable, "-c", _PROGRAM, "10", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert witness.stdout.readline().startswith("ready ")
        time.sleep(0.1)
        witness.send_signal(subprocess.signal.SIGSTOP)
        time.sleep(0.3)
        witness.send_signal(subprocess.signal.SIGCONT)
        time.sleep(0.1)
    finally:
        witness.kill()
        output, _ = witness.communicate(timeout=10)
    stalls = [Stall(*(int(f) for f in line.split())) for line in output.splitlines()]
    longest = max(s.end_ns - s.start_ns for s in stalls)  # a loaded machine may add short ones
    assert 0.25e9 < longest < 1.0e9
