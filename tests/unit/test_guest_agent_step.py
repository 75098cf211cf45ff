"""The guest-agent client never takes another call's reply for its own (issue 33).

A fake agent on a unix socket answers in order, as qemu-ga does, each reply after the delay its
command asks for; a call that gave up leaves its reply on the way. Against a real guest:
tests/vm/test_guest_agent_resync.py."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time

import pytest

from hilconform.emulators.errors import GuestAgentError
from hilconform.emulators.guest_agent import GuestAgent


class FakeAgent:
    """In-order JSON lines: `slow` answers after 0.6 s, `echo` at once, guest-sync-delimited
    with 0xFF first. Like a virtio-serial port, it has one stream whatever the host connects:
    requests are served one after the other, and each reply goes to whichever connection is
    current when it is ready (a reply of an abandoned call reaches the next connection).
    `echo_ids`: whether replies carry the request's id (qemu-ga's do)."""

    def __init__(self, path, echo_ids=True, garbage_first=False):
        self.path, self.echo_ids, self.garbage_first = path, echo_ids, garbage_first
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.seen: list[str] = []
        self.current = None
        self.requests: queue.Queue = queue.Queue()
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._answer, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.current = conn
            if self.garbage_first:
                conn.sendall(b'{"return": {"pid": 7}}\n{not json\n')
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        buffer = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.requests.put(json.loads(line))

    def _answer(self):
        while True:
            request = self.requests.get()
            command = request["execute"]
            self.seen.append(command)
            reply: dict = {"return": {"answer_to": command}}
            prefix = b""
            if command == "slow":
                time.sleep(0.6)
                reply = {"return": {"pid": 42}}
            elif command == "guest-sync-delimited":
                prefix, reply = b"\xff", {"return": request["arguments"]["id"]}
            if self.echo_ids and "id" in request:
                reply["id"] = request["id"]
            try:
                self.current.sendall(prefix + json.dumps(reply).encode() + b"\n")
            except OSError:
                pass  # nobody connected: the reply is lost, as a port without a host end drops it

    def close(self):
        self.server.close()


@pytest.fixture(params=[True, False], ids=["echoes-ids", "no-ids"])
def agent(request, tmp_path):
    fake = FakeAgent(tmp_path / "qga.sock", echo_ids=request.param)
    client = GuestAgent(tmp_path / "qga.sock")
    yield fake, client
    client.close()
    fake.close()


def test_the_call_after_a_timed_out_one_gets_its_own_reply(agent):
    fake, client = agent
    client.sync()
    with pytest.raises(GuestAgentError, match="no reply before the deadline"):
        client.call("slow", timeout_s=0.2)
    assert client.call("echo", timeout_s=5) == {"answer_to": "echo"}  # not {"pid": 42}
    assert client.call("echo", timeout_s=5) == {"answer_to": "echo"}
    assert client.resyncs == 1


def test_a_timed_out_call_without_a_reconnect_is_resynchronised(agent, monkeypatch):
    """The socket kept open across the timeout (the stale reply arrives on the same stream)."""
    fake, client = agent
    client.sync()
    monkeypatch.setattr(client, "close", lambda: setattr(client, "_in_step", False))
    with pytest.raises(GuestAgentError):
        client.call("slow", timeout_s=0.2)
    assert client.call("echo", timeout_s=5) == {"answer_to": "echo"}


def test_garbage_and_a_stale_reply_before_the_first_call_are_skipped(tmp_path):
    fake = FakeAgent(tmp_path / "qga.sock", echo_ids=False, garbage_first=True)
    client = GuestAgent(tmp_path / "qga.sock")
    try:
        assert client.call("echo", timeout_s=5) == {"answer_to": "echo"}  # synced first
        assert fake.seen[0] == "guest-sync-delimited"
    finally:
        client.close()
        fake.close()


def test_an_in_step_channel_sends_no_sync(agent):
    fake, client = agent
    client.sync()
    for _ in range(3):
        client.call("echo")
    assert fake.seen.count("guest-sync-delimited") == 1
