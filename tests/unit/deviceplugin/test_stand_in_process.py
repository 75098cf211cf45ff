"""The stand-in as the host starts it: `python3 -m hilconform.emulators.kubelet_stand_in`, JSON lines on
stdin/stdout, a real plugin registering with it."""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from dp_fake_plugin import FakePlugin

from hilconform.emulators.kubelet_stand_in import control

RESOURCE = "example.com/gpu"


class StandInProcess:
    """The stand-in process and a line reader with deadlines."""

    def __init__(self, plugin_dir: str):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hilconform.emulators.kubelet_stand_in",
                "--plugin-dir",
                plugin_dir,
                "--dial-timeout",
                "2",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue = queue.Queue()
        self.ids = itertools.count(1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(control.decode_reply(raw))
        self.lines.put(None)

    def next_line(self, timeout_s: float = 10.0) -> dict:
        try:
            message = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line from the stand-in within {timeout_s} s") from None
        assert message is not None, (
            "the stand-in closed its output: " + self.proc.stderr.read().decode()[-2000:]
        )
        return message

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def ask(self, method: str, params: dict | None = None, timeout_s: float = 10.0) -> dict:
        req_id = next(self.ids)
        self.send_raw(control.encode(control.request(req_id, method, params)))
        message = self.next_line(timeout_s)
        assert message.get("id") == req_id, message
        return message

    def result(self, method: str, params: dict | None = None) -> dict:
        message = self.ask(method, params)
        assert message["kind"] == "reply", message
        return message["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def stand_in():
    plugin_dir = tempfile.mkdtemp(prefix="dp", dir="/tmp")
    process = StandInProcess(plugin_dir)
    yield process, plugin_dir
    process.close()
    shutil.rmtree(plugin_dir, ignore_errors=True)


def until(check, what: str, timeout_s: float = 10.0):
    """Ask again until ``check()`` gives something; each ask is a control round trip."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
    raise AssertionError(f"{what} not seen within {timeout_s} s")


def test_the_host_drives_the_stand_in_over_stdio(stand_in):
    process, plugin_dir = stand_in
    ready = process.next_line()
    assert ready["kind"] == "event" and ready["event"] == "ready"
    assert ready["data"]["kubelet_socket"] == os.path.join(plugin_dir, "kubelet.sock")

    plugin = FakePlugin(plugin_dir).start()
    try:
        plugin.register()
        plugin.push_ids(["a", "b"], unhealthy=["c"])
        resource = until(
            lambda: process.result("state")["resources"].get(RESOURCE, {}).get("updates"),
            "a ListAndWatch update",
        )
        state = process.result("state")["resources"][RESOURCE]
        assert resource == 1 and (state["capacity"], state["allocatable"]) == (3, 2)

        allocated = process.result("allocate", {"resource": RESOURCE, "containers": [["a"]]})
        assert allocated["response"]["container_responses"][0]["devices"][0]["host_path"] == "/dev/fakea"

        unknown = process.ask("allocate", {"resource": "example.com/other", "containers": [["a"]]})
        assert unknown["kind"] == "error" and unknown["error"]["code"] == control.UNKNOWN_RESOURCE

        process.send_raw(b"{nope\n")
        malformed = process.next_line()
        assert malformed["id"] is None and malformed["error"]["code"] == control.PARSE_ERROR

        wrong = process.ask("reboot")
        assert wrong["error"]["code"] == control.UNKNOWN_METHOD and "reboot" in wrong["error"]["message"]

        records = process.result("records", {"since_seq": 0})
        kinds = [r["kind"] for r in records["records"]]
        for kind in (
            "kubelet_start",
            "register_request",
            "options",
            "register_accepted",
            "list_and_watch",
            "allocate_request",
            "allocate_response",
        ):
            assert kind in kinds
        assert json.loads(json.dumps(records)) == records and not records["more"]
        later = process.result("records", {"since_seq": records["last_seq"]})
        assert later["records"] == []

        restarted = process.result("restart_kubelet")
        assert restarted["generation"] == 2 and "fake.sock" in restarted["removed_sockets"]
        assert not os.path.exists(plugin.socket_path)

        assert process.result("stop") == {"stopping": True}
        assert process.proc.wait(10) == 0
        assert not os.path.exists(os.path.join(plugin_dir, "kubelet.sock"))
    finally:
        plugin.stop()


def test_end_of_input_stops_the_stand_in(stand_in):
    process, plugin_dir = stand_in
    assert process.next_line()["event"] == "ready"
    process.proc.stdin.close()
    assert process.proc.wait(10) == 0
    assert not os.path.exists(os.path.join(plugin_dir, "kubelet.sock"))


def test_a_plugin_dir_that_cannot_be_made_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "hilconform.emulators.kubelet_stand_in", "--plugin-dir", str(blocker / "dir")],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and "cannot start" in done.stderr


def test_a_second_stand_in_leaves_the_running_ones_sockets_and_journal_alone(tmp_path):
    """The node's own start and a harness's may meet: the second must not take kubelet.sock, the
    journal or the control socket from the first (the first keeps serving them)."""
    folder = tempfile.mkdtemp(prefix="hilc-si-", dir="/tmp")  # a unix socket path must stay short
    plugin_dir, control_path = os.path.join(folder, "plugins"), os.path.join(folder, "c.sock")
    journal = tmp_path / "records.jsonl"
    argv = [sys.executable, "-m", "hilconform.emulators.kubelet_stand_in", "--plugin-dir", plugin_dir,
            "--control", f"unix:{control_path}", "--journal", str(journal)]
    first = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert json.loads(first.stdout.readline())["event"] == "ready"
        kubelet_sock = os.stat(os.path.join(plugin_dir, "kubelet.sock")).st_ino
        journal_inode = journal.stat().st_ino
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert second.returncode == 2 and "already answers" in second.stderr, second.stderr
        assert os.stat(os.path.join(plugin_dir, "kubelet.sock")).st_ino == kubelet_sock
        assert journal.stat().st_ino == journal_inode and first.poll() is None
        asked = subprocess.run([sys.executable, "-m", "hilconform.emulators.kubelet_stand_in.ask",
                                control_path, json.dumps(control.request(1, "state", {}))],
                               capture_output=True, text=True, timeout=30)
        assert asked.returncode == 0 and "result" in json.loads(asked.stdout), asked.stdout + asked.stderr
    finally:
        first.terminate()
        first.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
