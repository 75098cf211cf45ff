"""QmpSession.connect: QEMU binds its QMP socket before it listens; a connect in between is refused."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from hilconform.emulators.errors import QmpError
from hilconform.emulators.qmp_session import QmpSession

GREETING = {
    "QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 22}, "package": ""}, "capabilities": []}
}


def _serve_qmp_later(sock: socket.socket, delay_s: float) -> threading.Thread:
    """Listen on an already bound socket after delay_s; answer the capabilities negotiation."""

    def serve() -> None:
        time.sleep(delay_s)
        sock.listen(1)
        conn, _ = sock.accept()
        decoder, pending = json.JSONDecoder(), ""
        with conn:
            conn.sendall(json.dumps(GREETING).encode() + b"\n")
            while chunk := conn.recv(4096):  # requests come without a newline: decode as they end
                pending += chunk.decode()
                while pending.strip():
                    try:
                        request, end = decoder.raw_decode(pending.lstrip())
                    except json.JSONDecodeError:
                        break
                    pending = pending.lstrip()[end:]
                    reply = {"return": {}}
                    if "id" in request:
                        reply["id"] = request["id"]
                    conn.sendall(json.dumps(reply).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _bound_socket(tmp_path) -> tuple[socket.socket, object]:
    path = tmp_path / "qmp.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))  # the path exists now; connects are refused until listen()
    return sock, path


def test_a_connect_refused_before_qemu_listens_is_retried(tmp_path):
    sock, path = _bound_socket(tmp_path)
    _serve_qmp_later(sock, 0.3)
    session = QmpSession(path, tmp_path / "events.jsonl")
    try:
        session.connect(timeout_s=5.0)
    finally:
        session.close()
        sock.close()


def test_a_socket_nobody_listens_on_fails_at_the_deadline(tmp_path):
    sock, path = _bound_socket(tmp_path)
    session = QmpSession(path, tmp_path / "events.jsonl")
    started = time.monotonic()
    try:
        with pytest.raises(QmpError, match="refused"):
            session.connect(timeout_s=0.5)
    finally:
        sock.close()
    assert 0.4 <= time.monotonic() - started < 3.0


def test_a_missing_socket_is_not_retried(tmp_path):
    session = QmpSession(tmp_path / "absent.sock", tmp_path / "events.jsonl")
    started = time.monotonic()
    with pytest.raises(QmpError, match="No such file"):
        session.connect(timeout_s=5.0)
    assert time.monotonic() - started < 1.0
