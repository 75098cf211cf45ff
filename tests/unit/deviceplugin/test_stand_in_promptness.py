"""The stand-in's real-time scheduling (emulators/kubelet_stand_in/promptness.py), in a child
process: the test process itself never runs real-time.

Why: DP-07's order of a plugin's message and a device's removal is read from the stand-in's
receipt times; they are the plugin's send times only when the stand-in's threads, gRPC's
included, run ahead of the node's other work: a policy set on the main thread alone would not do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hilconform.emulators.kubelet_stand_in.promptness import ABOVE_INTERRUPT_THREADS

_CHILD = """
import json, os, sys, threading
from hilconform.emulators.kubelet_stand_in.promptness import run_promptly
said = run_promptly(int(sys.argv[1]))
seen = {}
policy = lambda: os.sched_getscheduler(0)
thread = threading.Thread(target=lambda: seen.update(thread=policy()))
thread.start(); thread.join()
print(json.dumps({"said": said, "main": policy(), "thread": seen["thread"]}))
"""


def _child(priority: int) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(priority)], capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs CAP_SYS_NICE (root)")
def test_the_stand_in_and_every_thread_it_starts_later_run_real_time():
    seen = _child(ABOVE_INTERRUPT_THREADS)
    assert seen["said"] == f"SCHED_FIFO {ABOVE_INTERRUPT_THREADS}"
    assert seen["main"] == seen["thread"] == os.SCHED_FIFO


def test_priority_zero_leaves_the_scheduling_as_it_is():
    seen = _child(0)
    assert seen["said"].startswith("normal") and seen["main"] == seen["thread"] == os.SCHED_OTHER


def test_a_refused_priority_is_said_and_the_stand_in_runs_on():
    seen = _child(1000)  # above any SCHED_FIFO priority: refused even to root
    assert seen["said"].startswith("normal (SCHED_FIFO 1000 refused") and seen["main"] == os.SCHED_OTHER


def test_the_harness_starts_the_stand_in_above_the_interrupt_threads():
    from hilconform.fixtures.kubelet_node import start_script
    from hilconform.fixtures.kubelet_site import GUEST_SITE
    assert ABOVE_INTERRUPT_THREADS > 50  # pciehp's threaded interrupt runs at SCHED_FIFO 50
    assert f"--realtime {ABOVE_INTERRUPT_THREADS}" in start_script(GUEST_SITE)
