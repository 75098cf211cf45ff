"""wait_for_listener: a server's unix socket path appears at bind(), before it listens; a connect
in between is refused (qemu-nbd's socket: QEMU's blockdev-add failed so in LIFE-06)."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from hilconform.emulators.errors import InfrastructureError, WaitTimeout
from hilconform.emulators.processes import ChildProcess, wait_for_listener


def _bind_then_listen(path, delay_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))  # the path exists now; connects are refused until listen()
    threading.Timer(delay_s, sock.listen, args=(4,)).start()
    return sock


def test_a_bound_socket_counts_only_once_it_listens(tmp_path):
    path = tmp_path / "nbd.sock"
    sock = _bind_then_listen(path, 0.3)
    try:
        started = time.monotonic()
        wait_for_listener(path, 5.0)
        assert time.monotonic() - started >= 0.25
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # it listens now
    finally:
        sock.close()


def test_a_socket_nobody_listens_on_times_out_saying_so(tmp_path):
    path = tmp_path / "nbd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        with pytest.raises(WaitTimeout, match="nothing listened"):
            wait_for_listener(path, 0.4)


def test_a_child_that_exits_before_listening_is_reported_with_its_output(tmp_path):
    path = tmp_path / "nbd.sock"
    script = (
        f"import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind({str(path)!r}); "
        "print('cannot serve: test'); sys.exit(3)"
    )
    child = ChildProcess("nbd-gpu0", [sys.executable, "-c", script], tmp_path / "nbd.log", tmp_path)
    try:
        with pytest.raises(InfrastructureError, match="exited with status 3") as raised:
            wait_for_listener(path, 10.0, child)
        assert "cannot serve: test" in str(raised.value)
    finally:
        child.stop()
