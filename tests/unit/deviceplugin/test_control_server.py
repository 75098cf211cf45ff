"""The control stream: lines in, replies out by id; overlong lines answered and skipped; a unix socket."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tempfile
import threading

import pytest

from hilconform.emulators.kubelet_stand_in import control
from hilconform.emulators.kubelet_stand_in.control_server import Dispatcher, LineServer, UnixControlServer
from hilconform.emulators.kubelet_stand_in.device_manager import KubeletStandIn


@pytest.fixture
def stand_in():
    plugin_dir = tempfile.mkdtemp(prefix="dp", dir="/tmp")
    kubelet = KubeletStandIn(plugin_dir)
    kubelet.start()
    yield kubelet
    kubelet.stop()
    shutil.rmtree(plugin_dir, ignore_errors=True)


def replies(output: bytes) -> dict:
    lines = [control.decode_reply(line) for line in output.splitlines()]
    return {message.get("id"): message for message in lines}


def test_a_stream_of_requests_is_answered_by_id_and_an_overlong_line_is_skipped(stand_in):
    too_long = b'{"id": 9, "pad": "' + b"x" * control.MAX_LINE_BYTES + b'"}\n'
    requests = (
        too_long
        + b"\n"
        + control.encode(control.request(1, "state"))
        + b'{"id": "two", "method": "records", "params": {"max": 0}}\r\n'
        + control.encode(control.request(3, "stop"))
    )
    output = io.BytesIO()
    stopped = threading.Event()
    LineServer(io.BytesIO(requests), output, Dispatcher(stand_in), stopped.set, threading.Event()).serve()
    answered = replies(output.getvalue())
    assert answered[None]["error"]["code"] == control.LINE_TOO_LONG
    assert answered[1]["result"]["kubelet_socket"] == stand_in.socket_path
    assert answered["two"]["error"]["code"] == control.INVALID_PARAMS
    assert "'max' must be an integer from 1" in answered["two"]["error"]["message"]
    assert answered[3]["result"] == {"stopping": True} and stopped.is_set()
    assert len(answered) == 4


def test_the_unix_control_socket_serves_a_client(stand_in):
    path = os.path.join(stand_in.plugin_dir, "control")
    stopped = threading.Event()
    server = UnixControlServer(path, Dispatcher(stand_in), stopped.set, stopped)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(path)
            client.sendall(control.encode(control.request(1, "state")) + b"not json\n")
            reader = client.makefile("rb")
            answered = {}
            for _ in range(2):
                message = control.decode_reply(reader.readline())
                answered[message["id"]] = message
            assert answered[1]["result"]["generation"] == 1
            assert answered[None]["error"]["code"] == control.PARSE_ERROR
            client.sendall(control.encode(control.request(2, "stop")))
            assert json.loads(reader.readline())["result"] == {"stopping": True}
            assert stopped.wait(5)
            reader.close()
    finally:
        server.close()
    assert not os.path.exists(path)
