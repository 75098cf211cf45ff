"""The kernel log follower waits for records or its stop, never on a timer (issue 17).

Why: /dev/kmsg is followed with select; a 0.2 s timeout turn (to look at the stop flag) cost an
idle TCG guest ~1% of its CPU. A stop now wakes the select through a pipe. Shown on a FIFO under
/dev/shm (the follower treats /dev/ paths as kmsg: selected, not tailed like a file).
"""

from __future__ import annotations

import os
import select
import threading
import time

import pytest

from hilconform.runtime import kernel_log

RECORD = (b"3,120,5000000,-;pcieport 0000:00:10.0: AER: Uncorrected (Fatal) error message received "
          b"from 0000:01:00.0\n")


@pytest.fixture
def fifo():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")
    path = f"/dev/shm/hilconform-kmsg-{os.getpid()}"
    os.mkfifo(path)
    try:
        yield path
    finally:
        os.unlink(path)


def test_an_idle_follower_makes_no_turns_and_stops_at_once(fifo, monkeypatch):
    turns = []
    real_select = select.select
    monkeypatch.setattr(kernel_log.select, "select", lambda *a: (turns.append(a), real_select(*a))[1])
    seen = threading.Event()
    follower = kernel_log.KernelLogFollower(fifo, lambda event: seen.set(), from_start=True)
    assert follower.start()
    writer = os.open(fifo, os.O_WRONLY)  # a writer keeps the FIFO from reading EOF
    try:
        os.write(writer, RECORD)
        assert seen.wait(5), "the record written was not followed"
        time.sleep(0.6)
        idle_turns = len(turns)
        time.sleep(0.6)
        assert len(turns) == idle_turns, f"{len(turns) - idle_turns} turns in 0.6 s with nothing to read"
        stopping = time.monotonic()
        follower.stop()
        assert time.monotonic() - stopping < 0.5
        assert not follower._thread.is_alive()
    finally:
        os.close(writer)
