"""A wake of the transport's I/O thread is never lost (issue 17).

Why: a reply or event produced off the I/O thread (the request pool, the ticker, discovery)
wakes it through a pipe, one byte per loop turn. The drain used to clear the "a byte is in the
pipe" flag before reading the pipe: a wake between the two had its byte read with the flag left
set, and every later wake was skipped, so the loop turned only on its select timeout (each event
up to 0.1 s late; 1 s once the idle timeout grew, which made LIFE-06 twice as slow).
"""

from __future__ import annotations

import os
import select

from hilconform.runtime import transport


class NoHandler:
    def handle_line(self, session, line):  # pragma: no cover - no line is sent here
        raise AssertionError("no line expected")

    def close_session(self, session):  # pragma: no cover
        pass


def test_a_wake_during_the_drain_leaves_the_next_wake_able_to_write(monkeypatch):
    server = transport.Server(NoHandler(), "unix:/nonexistent/never-listened")
    server.wake()  # a byte in the pipe: the I/O thread is about to drain it
    real_read = os.read
    woke_during_drain = []

    def read_then_wake(fd, n):
        data = real_read(fd, n)
        if not woke_during_drain:
            woke_during_drain.append(True)
            server.wake()  # another thread's wake, in the middle of the drain
        return data

    monkeypatch.setattr(transport.os, "read", read_then_wake)
    server._drain_wake()
    monkeypatch.setattr(transport.os, "read", real_read)
    server.wake()  # a wake after the drain must reach the pipe
    readable, _, _ = select.select([server._rpipe], [], [], 0)
    assert readable, "the wake after the drain wrote nothing: the I/O thread would sleep through it"
