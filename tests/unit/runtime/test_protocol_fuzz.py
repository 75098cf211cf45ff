"""Protocol fuzzing of a runtime subprocess: 50 clients, 24,000 random lines, one unix socket.

Rules checked: the runtime stays alive; every line whose id it can read gets
exactly one reply or protocol error (never INTERNAL), every line it cannot
read gets one error with ``id: null``; its RSS stays flat after a warm-up; and
another client's ``inventory`` keeps being answered. How fast it is answered (the
target: p99 of 100 ms or less) is a speed target, so it is judged by a benchmark,
``benchmarks/protocol_fairness.py``, over several runs with the load recorded; this
test prints the figures and, with HILCONFORM_FUZZ_FIGURES=PATH, writes them. The mix:
valid requests (leases included), pipelines, bad JSON, wrong types, huge and
non-finite numbers, unknown methods and params, oversized lines, lines split
across writes, abrupt disconnects and subscribe floods. The generator is
seeded (HILCONFORM_FUZZ_SEED), so a failure can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from line_client import LineClient, next_line
from runtime_process import NVMES, RuntimeProcess, build_tree

from hilconform.runtime import protocol

SEED = int(os.environ.get("HILCONFORM_FUZZ_SEED", "20261201"))
CLIENTS = 50
LINES = 24_000  # over all clients
WARMUP_LINES = 4_000  # RSS is measured from here on
RSS_SLACK_KB = 5 * 1024
FIGURES_ENV = "HILCONFORM_FUZZ_FIGURES"  # a JSON file for benchmarks/protocol_fairness.py
REPLY_TIMEOUT_S = 20.0
RUN_DEADLINE_S = 150.0
PACED_RUN_S = 20.0  # clients spread their lines over this: heavy load, yet not a saturated machine
PROBE_EVERY_S = 0.02
HUGE_INT = "1" + "0" * 309  # too large for a double
UNKNOWN_BDF = "0000:7f:00.0"
EVENT_PREFIX = b'{"v":1,"event":"'
FULL_CHECK_EVERY = 25  # every 25th line read is decoded and validated in full, events included
PROBE_SCRIPT = Path(__file__).with_name("latency_probe.py")


class Progress:
    """Lines sent by all clients (thread-safe), so the main thread knows when warm-up ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lines = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.lines += n


# --- what the clients send -------------------------------------------------------------------------
def _line(req_id, method: str, params: dict | None = None) -> bytes:
    return protocol.encode(protocol.request(req_id, method, params))


def _valid(rng: random.Random, leases: list[str]) -> tuple[str, dict | None]:
    """A well-formed request (method, params) that may still be refused (unknown device, ...)."""
    device = rng.choice(NVMES + (UNKNOWN_BDF, "01:00.0"))
    choices = [
        ("hello", {"versions": [1, rng.randint(2, 9)], "client": f"fuzz-{rng.randint(0, 99)}"}),
        ("inventory", None),
        ("device", {"device": device}),
        ("transitions", None),
        ("stats", None),
        ("leases", None),
        ("subscribe", {"events": rng.sample(sorted(protocol.EVENTS), rng.randint(1, 3))}),
        ("unsubscribe", None),
        ("allocate", {"class": "nvme", "count": rng.randint(1, 2), "ttl_s": rng.uniform(0.2, 3.0)}),
        ("allocate", {"device": device, "holder": "fuzz", "ttl_s": rng.choice([1, 2.5])}),
        ("renew", {"lease": rng.choice(leases) if leases else "L999999", "ttl_s": rng.uniform(0.5, 3)}),
        ("release", {"lease": rng.choice(leases) if leases else "L999999"}),
        ("health_poll", rng.choice([None, {"device": device}])),
        ("recover", {"device": device}),  # HEALTHY: INVALID_STATE; unknown: UNKNOWN_DEVICE
        ("reset", {"device": UNKNOWN_BDF}),
    ]
    return rng.choice(choices)


def _invalid(rng: random.Random, req_id: int) -> tuple[bytes, str, bool]:
    """(line, expected error code, whether the runtime can read its id)."""
    i = req_id
    cases = [
        (b"{not json", protocol.PARSE_ERROR, False),
        (b'{"v":1,"id":' + str(i).encode() + b',"method":"hello"', protocol.PARSE_ERROR, False),
        (b"[1,2,3]", protocol.PARSE_ERROR, False),
        (b'"just a string"', protocol.PARSE_ERROR, False),
        (b"\xff\xfe\xfd", protocol.PARSE_ERROR, False),
        (f'{{"v":1,"id":{i},"method":"hello","params":{{"x":NaN}}}}'.encode(), protocol.PARSE_ERROR, False),
        (
            f'{{"v":1,"id":{i},"method":"renew","params":{{"lease":"L1","ttl_s":Infinity}}}}'.encode(),
            protocol.PARSE_ERROR,
            False,
        ),
        (b'{"v":1,"method":"hello"}', protocol.INVALID_REQUEST, False),
        (b'{"v":1,"id":true,"method":"hello"}', protocol.INVALID_REQUEST, False),
        (b'{"v":1,"id":[1],"method":"hello"}', protocol.INVALID_REQUEST, False),
        (f'{{"v":"1","id":{i},"method":"hello"}}'.encode(), protocol.INVALID_REQUEST, True),
        (f'{{"v":1,"id":{i},"method":7}}'.encode(), protocol.INVALID_REQUEST, True),
        (f'{{"v":1,"id":{i},"method":"hello","extra":1}}'.encode(), protocol.INVALID_REQUEST, True),
        (f'{{"v":{HUGE_INT},"id":{i},"method":"hello"}}'.encode(), protocol.UNSUPPORTED_VERSION, True),
        (f'{{"v":2,"id":{i},"method":"hello"}}'.encode(), protocol.UNSUPPORTED_VERSION, True),
        (f'{{"v":1,"id":{i},"method":"fly{rng.randint(0, 9)}"}}'.encode(), protocol.UNKNOWN_METHOD, True),
        (_line(i, "device", {}), protocol.INVALID_PARAMS, True),
        (_line(i, "device", {"device": 7}), protocol.INVALID_PARAMS, True),
        (_line(i, "hello", {"bogus": 1}), protocol.INVALID_PARAMS, True),
        (_line(i, "hello", {"versions": [1.0]}), protocol.INVALID_PARAMS, True),
        (_line(i, "hello", {"versions": [True]}), protocol.INVALID_PARAMS, True),
        (_line(i, "allocate", {"class": "nvme", "count": True}), protocol.INVALID_PARAMS, True),
        (_line(i, "allocate", {"class": "nvme", "count": 0}), protocol.INVALID_PARAMS, True),
        (_line(i, "allocate", {"class": "nvme", "ttl_s": -1}), protocol.INVALID_PARAMS, True),
        (_line(i, "allocate", {"class": "nvme", "ttl_s": 10**6}), protocol.INVALID_PARAMS, True),
        (_line(i, "subscribe", {"since_seq": -5}), protocol.INVALID_PARAMS, True),
        (_line(i, "subscribe", {"events": ["nope"]}), protocol.INVALID_PARAMS, True),
        (
            f'{{"v":1,"id":{i},"method":"allocate","params":{{"class":"nvme","ttl_s":{HUGE_INT}}}}}'.encode(),
            protocol.INVALID_PARAMS,
            True,
        ),
        (
            f'{{"v":1,"id":{i},"method":"allocate","params":{{"class":"nvme","count":{HUGE_INT}}}}}'.encode(),
            protocol.INVALID_PARAMS,
            True,
        ),
        (
            f'{{"v":1,"id":{i},"method":"renew","params":{{"lease":"L1","ttl_s":1e999}}}}'.encode(),
            protocol.INVALID_PARAMS,
            True,
        ),
        (f'{{"v":1,"id":{i},"method":"hello","params":[]}}'.encode(), protocol.INVALID_PARAMS, True),
    ]
    line, code, readable = rng.choice(cases)
    return line.rstrip(b"\n") + rng.choice([b"\n", b"\r\n"]), code, readable


class FuzzClient(threading.Thread):
    """One client: random steps, each followed by reading until everything sent is answered."""

    def __init__(self, index: int, path: str, budget: int, progress: Progress):
        super().__init__(name=f"fuzz-{index}", daemon=True)
        self.index, self.path, self.budget, self.progress = index, path, budget, progress
        self.rng = random.Random(SEED * 1000 + index)
        self.sent = 0
        self.ids = iter(range(index * 10_000_000, (index + 1) * 10_000_000))
        self.pending: dict[int, tuple[str, str | None]] = {}  # id -> (what, expected code or None)
        self.null_errors_due = 0
        self.leases: list[str] = []
        self.violations: list[str] = []
        self.counts = {"replies": 0, "errors": 0, "events": 0, "reconnects": 0, "refused": 0}
        self.sock: socket.socket | None = None
        self.buf = bytearray()
        self.lines_read = 0

    # -- connection ----------------------------------------------------------------------------
    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(REPLY_TIMEOUT_S)
        self.sock.connect(self.path)
        self.buf.clear()

    def reconnect(self) -> None:
        self.sock.close()
        self.pending.clear()
        self.null_errors_due = 0
        self.counts["reconnects"] += 1
        self.connect()

    def send(self, data: bytes, lines: int) -> None:
        self.sock.sendall(data)
        self.sent += lines
        self.progress.add(lines)

    def track(self, what: str, expected: str | None = None) -> int:
        req_id = next(self.ids)
        self.pending[req_id] = (what, expected)
        return req_id

    # -- steps ---------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.connect()
            started, per_line_s = time.monotonic(), PACED_RUN_S / self.budget
            while self.sent < self.budget:
                self.step()
                self.settle()
                ahead = started + self.sent * per_line_s - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        except Exception as exc:  # noqa: BLE001 - reported as a violation with the client's seed
            self.violations.append(f"client {self.index}: {exc!r}")
        finally:
            if self.sock:
                self.sock.close()

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.50:
            method, params = _valid(self.rng, self.leases)
            self.send(_line(self.track(method), method, params), 1)
        elif roll < 0.60:  # a pipeline
            n = self.rng.randint(2, 20)
            data = b""
            for _ in range(n):
                method, params = _valid(self.rng, self.leases)
                data += _line(self.track(method), method, params)
            self.send(data, n)
        elif roll < 0.85:
            req_id = next(self.ids)
            line, code, readable = _invalid(self.rng, req_id)
            if readable:
                self.pending[req_id] = ("invalid", code)
            else:
                self.null_errors_due += 1
            self.send(line, 1)
        elif roll < 0.87:  # an oversized line, then a valid one in the same write
            big = b'{"v":1,"id":1,"method":"hello","params":{"client":"' + b"x" * 70_000 + b'"}}\n'
            self.null_errors_due += 1
            self.send(big + _line(self.track("hello"), "hello"), 2)
        elif roll < 0.92:  # one line in pieces
            method, params = _valid(self.rng, self.leases)
            line = _line(self.track(method), method, params)
            cut = self.rng.randint(1, len(line) - 1)
            self.sock.sendall(line[:cut])
            time.sleep(self.rng.uniform(0, 0.01))
            self.send(line[cut:], 1)
        elif roll < 0.98:  # requests, maybe half a line, then gone
            data = b"".join(_line(next(self.ids), *_valid(self.rng, self.leases)) for _ in range(3))
            if self.rng.random() < 0.5:
                data += b'{"v":1,"id":5,"meth'
            self.send(data, 3)
            self.reconnect()
        else:  # a subscribe flood: replays of the whole history, pipelined
            n = self.rng.randint(2, 4)
            data = b"".join(_line(self.track("subscribe"), "subscribe", {"since_seq": 0}) for _ in range(n))
            data += _line(self.track("unsubscribe"), "unsubscribe")
            self.send(data, n + 1)

    # -- reading -------------------------------------------------------------------------------
    def settle(self) -> None:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while self.pending or self.null_errors_due > 0:
            if time.monotonic() > deadline:
                what = sorted(self.pending.items())[:3]
                self.violations.append(
                    f"client {self.index}: no reply within {REPLY_TIMEOUT_S}s to {what} "
                    f"({self.null_errors_due} id-null errors due)"
                )
                self.reconnect()
                return
            try:
                msg = self.read()
            except ConnectionError:
                self.reconnect()  # refused past max_clients (counted), or a reconnect race
                return
            self.judge(msg)

    def read(self) -> dict:
        line = next_line(self.sock, self.buf)
        self.lines_read += 1
        if line.startswith(EVENT_PREFIX) and self.lines_read % FULL_CHECK_EVERY:
            return {"kind": "event"}  # most events: the prefix is enough (decoding all costs the GIL)
        try:
            return protocol.decode_message(line)
        except protocol.ProtocolError as exc:
            self.violations.append(
                f"client {self.index}: malformed line from the runtime: {exc} {line[:200]!r}"
            )
            return {"kind": "event"}

    def judge(self, msg: dict) -> None:
        if msg["kind"] == "event":
            self.counts["events"] += 1
            return
        if msg["kind"] == "error":
            self.counts["errors"] += 1
            code = msg["error"]["code"]
            if code not in protocol.ERROR_CODES or code == protocol.INTERNAL:
                self.violations.append(f"client {self.index}: {code}: {msg['error']['message'][:300]}")
            if code == protocol.TOO_MANY_CLIENTS:
                self.counts["refused"] += 1
                return
        else:
            self.counts["replies"] += 1
        req_id = msg.get("id")
        if req_id is None:
            self.null_errors_due -= 1
            if self.null_errors_due < 0:
                self.violations.append(f"client {self.index}: an id-null error nobody caused: {msg}")
            return
        what, expected = self.pending.pop(req_id, (None, None))
        if what is None:
            self.violations.append(f"client {self.index}: a reply to no pending request: {str(msg)[:200]}")
            return
        code = msg["error"]["code"] if msg["kind"] == "error" else None
        if expected is not None and code != expected:
            self.violations.append(
                f"client {self.index}: {what} answered {code or 'a result'}, not {expected}"
            )
        if what == "allocate" and code is None:
            self.leases = (self.leases + [msg["result"]["lease"]])[-4:]


class LatencyProbe:
    """Another client, in a process of its own: ``inventory`` every 20 ms (latency_probe.py)."""

    def __init__(self, path: str):
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE_SCRIPT), path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=PROBE_SCRIPT.parent,
        )

    def finish(self) -> tuple[list[float], list[str]]:
        out, _ = self.proc.communicate(b"", timeout=REPLY_TIMEOUT_S + 10)
        result = json.loads(out)
        return result["samples"], result["failures"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@pytest.fixture
def fuzzed_runtime(tmp_path):
    rt = RuntimeProcess(build_tree(tmp_path), health_poll_ms=500).start()
    with LineClient(rt.path) as client:
        rt.wait_all_healthy(client)
    yield rt
    rt.stop()


def test_protocol_fuzz_keeps_the_runtime_alive_correct_flat_and_fair(fuzzed_runtime):
    rt = fuzzed_runtime
    progress = Progress()
    clients = [FuzzClient(i, rt.path, LINES // CLIENTS, progress) for i in range(CLIENTS)]
    probe = LatencyProbe(rt.path)
    try:
        started, cpu_start = time.monotonic(), rt.cpu_s()
        for client in clients:
            client.start()
        while progress.lines < WARMUP_LINES and any(c.is_alive() for c in clients):
            time.sleep(0.05)
        rss_start = rt.rss_kb()
        rss_max = rss_start
        deadline = started + RUN_DEADLINE_S
        while any(c.is_alive() for c in clients) and time.monotonic() < deadline:
            rss_max = max(rss_max, rt.rss_kb())
            time.sleep(0.25)
        samples, probe_failures = probe.finish()
    finally:
        probe.close()
    elapsed, cpu = time.monotonic() - started, rt.cpu_s() - cpu_start
    alive = rt.alive()
    rss_end = rt.rss_kb() if alive else None
    with LineClient(rt.path) as after:
        stats = after.ok("stats")
    violations = [v for c in clients for v in c.violations] + probe_failures
    totals = {k: sum(c.counts[k] for c in clients) for k in clients[0].counts}
    figures = (
        f"protocol fuzz (seed {SEED}): {progress.lines} lines from {CLIENTS} clients in {elapsed:.1f} s; "
        f"{totals}\n"
        f"inventory latency (other client): n={len(samples)} "
        f"median={statistics.median(samples) * 1000:.1f} ms "
        f"p99={_p99(samples) * 1000:.1f} ms max={max(samples) * 1000:.1f} ms\n"
        f"runtime RSS: start {rss_start} kB (after {WARMUP_LINES} lines), end {rss_end} kB, "
        f"max {rss_max} kB; "
        f"runtime CPU {cpu:.1f} s; threads {stats['threads']}, internal_errors {stats['internal_errors']}, "
        f"events_dropped {stats['events_dropped']}, clients_refused {stats['clients_refused']}"
    )
    print("\n" + figures)
    if os.environ.get(FIGURES_ENV):
        Path(os.environ[FIGURES_ENV]).write_text(json.dumps({
            "seed": SEED, "lines": progress.lines, "elapsed_s": elapsed, "inventory_n": len(samples),
            "inventory_median_ms": statistics.median(samples) * 1000 if samples else None,
            "inventory_p99_ms": _p99(samples) * 1000 if samples else None,
            "inventory_max_ms": max(samples) * 1000 if samples else None, "runtime_cpu_s": cpu}))
    assert alive, figures
    assert not any(c.is_alive() for c in clients), f"clients still running after {RUN_DEADLINE_S}s\n{figures}"
    assert progress.lines >= 20_000, figures
    assert not violations, f"{len(violations)} violation(s), first: {violations[:5]}\n{figures}"
    assert stats["internal_errors"] == 0, figures
    assert rss_end - rss_start <= RSS_SLACK_KB, f"RSS grew by {rss_end - rss_start} kB\n{figures}"
    assert samples, f"the other client's inventory was never answered\n{figures}"
    json.dumps(stats)  # the runtime's own figures stay JSON
