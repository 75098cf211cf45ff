"""The reference runtime under abuse, as a real process on a real unix socket.

Each test reproduces one way a client (or the host's limits) broke the
runtime: file-descriptor exhaustion faulting healthy devices, numbers that
crash float conversion, one pipelining client starving the others, a listen
backlog that refuses simultaneous connects, and the line limit counting the
``\\r\\n``. The runtime runs over a fake sysfs tree (no VM).
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time

import pytest
from line_client import LineClient
from runtime_process import NVMES, RuntimeProcess, build_tree

from hilconform.runtime import protocol
from hilconform.runtime.config import ConfigError, load

CPU_WINDOW_S = 2.0
MAX_CPU_S = 0.5  # over CPU_WINDOW_S: a busy-looping I/O thread burns ~2 s
MAX_ACCEPT_LOG_LINES = 20


@pytest.fixture
def tree(tmp_path):
    return build_tree(tmp_path)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """One runtime for the tests that leave it as they found it (no lease kept)."""
    rt = RuntimeProcess(build_tree(tmp_path_factory.mktemp("tree"))).start()
    with LineClient(rt.path) as client:
        rt.wait_all_healthy(client)
    yield rt
    rt.stop()


def _open_nonblocking(path: str, count: int) -> tuple[list[socket.socket], int]:
    """``count`` non-blocking connects; returns (connected sockets, refused count)."""
    socks, refused = [], 0
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex(path)
        if rc == 0:
            socks.append(s)
        else:
            assert rc in (errno.EAGAIN, errno.ECONNREFUSED), errno.errorcode.get(rc, rc)
            refused += 1
            s.close()
    return socks, refused


def _flood(path: str, count: int, within_s: float = 5.0) -> tuple[list[socket.socket], int]:
    """Up to ``count`` connections, retrying connects the backlog refuses, for at most ``within_s``."""
    socks, refusals = [], 0
    deadline = time.monotonic() + within_s
    while len(socks) < count and time.monotonic() < deadline:
        more, refused = _open_nonblocking(path, count - len(socks))
        socks += more
        refusals += refused
        if refused:
            time.sleep(0.005)
    return socks, refusals


def _bad_transitions(monitor: LineClient) -> list[dict]:
    monitor.call("inventory")  # collects the events that arrived before its reply
    return [
        e["data"]
        for e in monitor.events
        if e["event"] == "transition" and e["data"]["view"] == "health" and e["data"]["from"] == "HEALTHY"
    ]


def _accept_lines(rt: RuntimeProcess) -> list[str]:
    return [line for line in rt.log_text().splitlines() if "accept" in line]


# --- 1. file-descriptor exhaustion ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("nofile", "connections", "config", "outcome"),
    [
        pytest.param(1024, 1100, {}, "refused", id="past-the-connection-bound"),
        pytest.param(96, 200, {}, "refused", id="past-the-fd-reserve"),
        pytest.param(48, 120, {"client_fd_reserve": 0}, "exhausted", id="fds-exhausted"),
    ],
)
def test_connection_flood_never_faults_a_device_nor_spins(tree, nofile, connections, config, outcome):
    rt = RuntimeProcess(tree, nofile=nofile, health_poll_ms=100, **config).start()
    flood: list[socket.socket] = []
    try:
        monitor = LineClient(rt.path)
        rt.wait_all_healthy(monitor)
        monitor.ok("subscribe", {"events": ["transition"]})
        flood, refused = _flood(rt.path, connections)
        cpu0 = rt.cpu_s()
        time.sleep(CPU_WINDOW_S)
        cpu = rt.cpu_s() - cpu0
        assert rt.alive()
        left = _bad_transitions(monitor)
        states = {d["device"]: d["state"] for d in monitor.ok("inventory")["devices"]}
        print(
            f"\nflood: {len(flood)} connected, {refused} connects refused; "
            f"runtime cpu {cpu:.2f}s in {CPU_WINDOW_S}s"
        )
        assert not left, f"devices left HEALTHY under fd pressure: {left}"
        assert all(states[b] == "HEALTHY" for b in NVMES), states
        assert cpu < MAX_CPU_S, f"runtime used {cpu:.2f}s CPU in {CPU_WINDOW_S}s (busy loop?)"
        accepts = _accept_lines(rt)
        assert len(accepts) <= MAX_ACCEPT_LOG_LINES, f"{len(accepts)} accept log lines: {accepts[:3]}"
        if outcome == "exhausted":  # checks were inconclusive, not faults
            assert "Too many open files" in rt.log_text(), "the test never exhausted the runtime's fds"
        else:  # past the bound: one clear error line, then the runtime closes the connection
            assert "Too many open files" not in rt.log_text()
            polled = monitor.ok("health_poll")["devices"]
            assert all("checkpoint" in polled[b] for b in NVMES), polled  # fds left for device checks
            for s in flood[-20:]:
                s.setblocking(True)
                s.settimeout(5.0)
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
                lines = data.splitlines()
                assert len(lines) == 1, data[:300]
                msg = protocol.decode_message(lines[0])
                assert msg["kind"] == "error" and msg["error"]["code"] == protocol.TOO_MANY_CLIENTS, msg
        for s in flood:
            s.close()
        flood = []
        deadline = time.monotonic() + 10
        while True:  # the runtime serves new clients again once the flood is gone
            try:
                with LineClient(rt.path, timeout=2.0) as fresh:
                    assert fresh.ok("hello")["protocol"] == 1
                    break
            except (OSError, AssertionError):
                assert time.monotonic() < deadline, "no new client served after the flood ended"
                time.sleep(0.1)
        time.sleep(0.3)  # a few health polls with fds to spare: still HEALTHY
        assert not _bad_transitions(monitor)
        rt.wait_all_healthy(monitor, timeout=1.0)
    finally:
        for s in flood:
            s.close()
        rt.stop()


# --- 2. numbers ---------------------------------------------------------------------------------
def _raw_request(req_id: int, method: str, params_json: str) -> bytes:
    return f'{{"v":1,"id":{req_id},"method":"{method}","params":{params_json}}}\n'.encode()


@pytest.mark.parametrize(
    ("method", "params_json"),
    [
        ("allocate", '{"class":"nvme","ttl_s":1' + "0" * 309 + "}"),
        ("allocate", '{"class":"nvme","ttl_s":1e999}'),
        ("allocate", '{"class":"nvme","ttl_s":0}'),
        ("allocate", '{"class":"nvme","ttl_s":-5}'),
        ("allocate", '{"class":"nvme","ttl_s":86401}'),
        ("allocate", '{"class":"nvme","ttl_s":true}'),
        ("allocate", '{"class":"nvme","count":0}'),
        ("allocate", '{"class":"nvme","count":1025}'),
        ("allocate", '{"class":"nvme","count":1' + "0" * 309 + "}"),
        ("allocate", '{"class":"nvme","count":true}'),
        ("allocate", '{"class":"nvme","count":2.0}'),
        ("hello", '{"versions":[1.0]}'),
        ("hello", '{"versions":[true]}'),
        ("hello", '{"versions":["1"]}'),
        ("hello", '{"versions":[1' + "0" * 400 + "]}"),
        ("subscribe", '{"since_seq":-1}'),
        ("subscribe", '{"since_seq":1' + "0" * 309 + "}"),
    ],
)
def test_numbers_out_of_range_are_invalid_params(runtime, method, params_json):
    with LineClient(runtime.path) as client:
        reply = client.call_raw(_raw_request(7, method, params_json), 7)
        assert reply["kind"] == "error", reply
        assert reply["error"]["code"] == protocol.INVALID_PARAMS, reply["error"]
        assert client.ok("inventory")["complete"]  # and the runtime goes on serving


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_parse_errors(runtime, literal):
    with LineClient(runtime.path) as client:
        client.send_raw(_raw_request(3, "renew", f'{{"lease":"x","ttl_s":{literal}}}'))
        reply = client.read_message()
        assert reply["kind"] == "error" and reply["error"]["code"] == protocol.PARSE_ERROR, reply


def test_renew_with_a_huge_ttl_is_invalid_params_and_the_lease_is_kept(runtime):
    with LineClient(runtime.path) as client:
        runtime.wait_all_healthy(client)
        lease = client.ok("allocate", {"class": "nvme", "ttl_s": 60})
        try:
            huge = '{"lease":"' + lease["lease"] + '","ttl_s":1' + "0" * 309 + "}"
            reply = client.call_raw(_raw_request(90, "renew", huge), 90)
            assert reply["kind"] == "error" and reply["error"]["code"] == protocol.INVALID_PARAMS, reply
            assert client.ok("renew", {"lease": lease["lease"], "ttl_s": 86400})["ttl_s"] == 86400
        finally:
            assert client.ok("release", {"lease": lease["lease"]})["released"]


def test_integer_versions_and_ranges_at_their_bounds_are_accepted(runtime):
    with LineClient(runtime.path) as client:
        runtime.wait_all_healthy(client)
        assert client.ok("hello", {"versions": [1, 2]})["protocol"] == 1
        lease = client.ok("allocate", {"class": "nvme", "count": 1, "ttl_s": 86400})
        assert client.ok("renew", {"lease": lease["lease"], "ttl_s": 0.5})["ttl_s"] == 0.5
        client.ok("release", {"lease": lease["lease"]})
        reply = client.call("allocate", {"class": "nvme", "count": 1024})
        assert reply["error"]["code"] == protocol.INSUFFICIENT_DEVICES, reply


# --- 3. fairness --------------------------------------------------------------------------------
def test_a_pipelining_client_does_not_delay_another(runtime):
    polls = 1000
    with LineClient(runtime.path, timeout=60) as greedy, LineClient(runtime.path) as other:
        runtime.wait_all_healthy(other)
        answered: list[int] = []

        def read_greedy() -> None:
            while len(answered) < polls:
                msg = greedy.read_message(60)
                if msg["kind"] != "event":
                    assert "result" in msg, msg
                    answered.append(msg["id"])

        reader = threading.Thread(target=read_greedy, daemon=True)
        reader.start()
        greedy.send_raw(b"".join(protocol.encode(protocol.request(i, "health_poll")) for i in range(polls)))
        latencies, threads = [], []
        while len(answered) < polls and len(latencies) < 40:
            t0 = time.monotonic()
            other.ok("inventory")
            latencies.append(time.monotonic() - t0)
            threads.append(other.ok("stats")["threads"])
            time.sleep(0.02)
        reader.join(60)
        print(
            f"\ninventory during {polls} pipelined health_poll: n={len(latencies)} "
            f"max={max(latencies) * 1000:.1f} ms; runtime threads max={max(threads)}; "
            f"answered {len(answered)}"
        )
        assert len(answered) == polls
        assert max(latencies) < 0.5, f"inventory took {max(latencies):.3f}s behind another's pipeline"
        assert max(threads) <= 16, f"{max(threads)} threads: one per request?"


# --- 4. backlog and the line limit ---------------------------------------------------------------
def test_fifty_simultaneous_connects_are_all_queued(runtime):
    runtime.freeze()  # nothing is accepted until all 50 connects were made
    try:
        socks, refused = _open_nonblocking(runtime.path, 50)
    finally:
        runtime.thaw()
    try:
        assert refused == 0, f"{refused} of 50 connects refused by the listen backlog"
        for s in socks:
            s.setblocking(True)
            s.settimeout(10)
            s.sendall(protocol.encode(protocol.request(1, "hello")))
            assert b'"result"' in s.recv(65536)
    finally:
        for s in socks:
            s.close()


def _line_of(size: int, req_id: int) -> bytes:
    """A hello request of exactly ``size`` bytes (the client name pads it)."""
    head = json.dumps(
        {"v": 1, "id": req_id, "method": "hello", "params": {"client": ""}}, separators=(",", ":")
    )
    line = head.replace('"client":""', '"client":"' + "x" * (size - len(head)) + '"').encode()
    assert len(line) == size
    return line


def test_line_limit_does_not_count_the_crlf(runtime):
    limit = protocol.MAX_LINE_BYTES
    with LineClient(runtime.path) as client:
        assert "result" in client.call_raw(_line_of(limit, 1) + b"\r\n", 1)
        client.send_raw(_line_of(limit, 2) + b"\r")  # the \r arrives before its \n
        time.sleep(0.2)
        assert "result" in client.call_raw(b"\n", 2)
        client.send_raw(_line_of(limit + 1, 3) + b"\r\n")
        err = client.read_message()
        assert err["kind"] == "error" and err["error"]["code"] == protocol.LINE_TOO_LONG, err
        assert "result" in client.call("hello")


# --- the bounds are config keys, read strictly ------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [("max_clients", 0), ("max_requests_in_flight", -1), ("request_workers", 0), ("client_fd_reserve", -1)],
)
def test_bad_bounds_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        load(None, {key: value})
    assert err.value.key == key


def test_hello_reports_the_client_bounds(runtime):
    with LineClient(runtime.path) as client:
        config = client.ok("hello")["config"]
    assert config["max_clients"] == 64 and config["max_requests_in_flight"] == 16
