"""The service against fake sysfs trees: leases, AER policy, lost config, sessions and sockets.

``Harness`` (also used by test_procedures.py) starts a Service on a FakeSysfs
with a QueueChangeSource and no socket; ``Client`` talks to it through the
same line handler the transports use.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import weakref

import pytest
from fakesysfs import ConfigBuilder, FakeSysfs, mem_bar, nvme_config, root_port_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hilconform.runtime import health_watch, protocol
from hilconform.runtime import service as service_module
from hilconform.runtime.config import ConfigError, load
from hilconform.runtime.discovery import QueueChangeSource
from hilconform.runtime.kernel_log import parse_record
from hilconform.runtime.service import Service
from hilconform.runtime.transport import Session

TIMEOUT = 10.0  # generous: CI machines are shared and slow
_sids = itertools.count(1000)


class Client:
    """A session driven in-process: requests go to handle_line, output is parsed back."""

    def __init__(self, svc: Service, subscribe: bool = True, max_bytes: int = 1 << 30):
        self.svc = svc
        self.session = Session(next(_sids), "test", max_bytes, lambda: None)
        self.msgs: list[dict] = []
        self._ids = itertools.count(1)
        svc.open_session(self.session)
        if subscribe:
            assert "result" in self.call("subscribe", {"since_seq": 0})

    def pump(self) -> list[dict]:
        while chunk := self.session.peek():
            self.session.consume(len(chunk))
            self.msgs.append(protocol.decode_message(chunk))
        return self.msgs

    def send_line(self, line: bytes) -> None:
        self.svc.handle_line(self.session, line)

    def call(self, method: str, params: dict | None = None, timeout: float = TIMEOUT) -> dict:
        req_id = next(self._ids)
        start = len(self.pump())
        self.send_line(protocol.encode(protocol.request(req_id, method, params)).rstrip(b"\n"))
        return self.wait(
            lambda m: m.get("id") == req_id and m["kind"] != "event", timeout, f"reply to {method}", start
        )

    def ok(self, method: str, params: dict | None = None, timeout: float = TIMEOUT):
        reply = self.call(method, params, timeout)
        assert "result" in reply, reply
        return reply["result"]

    def wait(self, pred, timeout: float = TIMEOUT, what: str = "message", seen: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            msgs = self.pump()
            for msg in msgs[seen:]:
                if pred(msg):
                    return msg
            seen = len(msgs)
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.005)

    def events(self, name: str | None = None, **match) -> list[dict]:
        out = []
        for msg in self.pump():
            if msg["kind"] != "event" or (name and msg["event"] != name):
                continue
            if all(msg["data"].get(k) == v for k, v in match.items()):
                out.append(msg["data"])
        return out

    def wait_event(self, name: str, timeout: float = TIMEOUT, **match) -> dict:
        def pred(m):
            return (
                m["kind"] == "event"
                and m["event"] == name
                and all(m["data"].get(k) == v for k, v in match.items())
            )

        return self.wait(pred, timeout, f"event {name} {match}")["data"]

    def wait_state(self, device: str, state: str, timeout: float = TIMEOUT) -> dict:
        return self.wait_event("transition", timeout, device=device, view="health", to=state)

    def order(self) -> list[tuple[str, str]]:
        """(event, step-or-to) of every event, in order, for ordering asserts."""
        out = []
        for m in self.pump():
            if m["kind"] == "event":
                d = m["data"]
                out.append((m["event"], d.get("step") or d.get("to") or d.get("reason") or ""))
        return out


class Harness:
    """A started Service on a fake tree (no socket unless serve=True)."""

    PORT = "0000:00:02.0"
    NVME = "0000:01:00.0"

    def __init__(self, tmp_path, serve: bool = False, **overrides):
        self.fake = FakeSysfs(tmp_path)
        self.source = QueueChangeSource()
        self.sockdir = tempfile.mkdtemp(prefix="hc", dir="/tmp")  # short: a unix socket's path
        weakref.finalize(self, shutil.rmtree, self.sockdir, True)  # gone with the harness, stopped or not
        self.overrides = {
            "transport": f"unix:{self.sockdir}/rt.sock",
            "sysfs_root": str(tmp_path),
            "kernel_log": "",
            "udev": False,
            "hot_add_step_timeout_ms": 300,
            "health_poll_ms": 3_600_000,
            "reset_timeout_ms": 2000,
            **overrides,
        }
        self.serve = serve
        self.svc: Service | None = None

    def add_port(self, bdf: str = PORT, slot: int = 1, dll_active: bool = True, aer: bool = True) -> None:
        self.fake.add_device(
            bdf, root_port_config(slot_number=slot, dll_active=dll_active), driver="pcieport", aer=aer
        )

    def add_nvme(
        self,
        bdf: str = NVME,
        port: str | None = PORT,
        slot: str | None = "1",
        config=None,
        inflight=(0, 0),
        firmware="1.0",
        driver: str | None = "nvme",
        serial: str = "SN1",
        mmio: bytes = b"\x01\x00\x00\x00" * 1024,
        **kw,
    ) -> None:
        if port and not self.fake.sysfs.exists(port):
            self.add_port(port, slot=int(slot or 1))
        self.fake.add_device(
            bdf,
            config or nvme_config(),
            parent=port,
            driver=driver,
            slot=slot,
            resource=[mem_bar(0xFE000000, 0x4000)],
            mmio={0: mmio},
            nvme_inflight=inflight,
            nvme_serial=serial,
            nvme_firmware=firmware,
            reset_method=kw.pop("reset_method", "flr bus"),
            msi_irqs=kw.pop("msi_irqs", (24, 25)),
            **kw,
        )

    def start(self, **overrides) -> Service:
        cfg = load(None, {**self.overrides, **overrides})
        self.svc = Service(cfg, sysfs=self.fake.sysfs, change_source=self.source)
        self.svc.start(serve=self.serve)
        return self.svc

    def client(self, **kw) -> Client:
        return Client(self.svc, **kw)

    def stop(self) -> None:
        if self.svc:
            self.svc.request_stop("test over")
            self.svc.stop()


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.stop()


def healthy_nvme(harness: Harness, **start) -> Client:
    harness.add_nvme()
    harness.start(**start)
    client = harness.client()
    client.wait_state(Harness.NVME, "HEALTHY")
    return client


# --- leases (LIFE-03/04) -------------------------------------------------------------------------
def test_allocate_renew_release_walks_the_health_view(harness):
    c = healthy_nvme(harness)
    lease = c.ok("allocate", {"device": Harness.NVME, "holder": "job-7"})
    assert lease["devices"] == [Harness.NVME] and lease["holder"] == "job-7"
    c.wait_state(Harness.NVME, "ALLOCATED")
    c.ok("renew", {"lease": lease["lease"]})
    c.wait_event("transition", device=Harness.NVME, view="main", to="RUNNING")
    c.ok("release", {"lease": lease["lease"]})
    c.wait_state(Harness.NVME, "RELEASED")
    c.wait(
        lambda m: (
            m.get("event") == "transition"
            and m["data"]["from"] == "RELEASED"
            and m["data"]["to"] == "HEALTHY"
        )
    )
    assert c.ok("device", {"device": Harness.NVME})["state"] == "HEALTHY"
    for t in c.events("transition"):
        assert t["cause"] and t["checkpoint"]["name"] and t["ts_ns"] > 0


def test_never_two_holders_and_clear_refusals(harness):
    c = healthy_nvme(harness)
    c.ok("allocate", {"device": Harness.NVME})
    again = c.call("allocate", {"device": Harness.NVME})
    assert again["error"]["code"] == protocol.DEVICE_BUSY
    by_class = c.call("allocate", {"class": "nvme", "count": 1})
    assert by_class["error"]["code"] == protocol.INSUFFICIENT_DEVICES
    assert c.call("allocate", {"device": "0000:09:00.0"})["error"]["code"] == protocol.UNKNOWN_DEVICE
    assert c.call("renew", {"lease": "L999"})["error"]["code"] == protocol.UNKNOWN_LEASE
    assert len(c.ok("leases")["leases"]) == 1


def test_allocating_a_device_that_is_not_healthy_is_refused(harness):
    harness.add_nvme(firmware="0.9")
    harness.start(firmware={"1b36:0010": "1.0"})
    c = harness.client()
    c.wait_state(Harness.NVME, "FAULTED")
    reply = c.call("allocate", {"device": Harness.NVME})
    assert reply["error"]["code"] == protocol.NOT_HEALTHY
    assert "FAULTED" in reply["error"]["message"]


def test_allocate_holds_no_lock_across_its_config_read_and_rechecks_after_it(harness, monkeypatch):
    """A config read that blocks (a link being reset) delays only its own allocate: another client is
    answered meanwhile, a second allocate of the device is DEVICE_BUSY, and an error recovery that
    began during the read makes the allocate NOT_HEALTHY instead of a grant."""
    c = healthy_nvme(harness)
    other = harness.client(subscribe=False)
    entered, release = threading.Event(), threading.Event()
    checkpoint = service_module.procedures.config_intact

    def blocking_checkpoint(*args, **kwargs):
        entered.set()
        release.wait(TIMEOUT)
        return checkpoint(*args, **kwargs)

    monkeypatch.setattr(service_module.procedures, "config_intact", blocking_checkpoint)
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(c.call("allocate", {"device": Harness.NVME})))
    thread.start()
    try:
        assert entered.wait(TIMEOUT)
        started = time.monotonic()
        other.ok("inventory")
        assert time.monotonic() - started < 1.0, "inventory waited behind an allocate's config read"
        assert other.call("allocate", {"device": Harness.NVME})["error"]["code"] == protocol.DEVICE_BUSY
        kernel_line(harness, FATAL_LINE)  # the error becomes known while the allocate reads config
    finally:
        release.set()
        thread.join(TIMEOUT)
    assert answer["error"]["code"] == protocol.NOT_HEALTHY, answer
    assert "error recovery under way" in answer["error"]["message"]
    assert not c.ok("leases")["leases"]


def test_allocate_n_devices_of_a_class(harness):
    harness.add_nvme()
    harness.add_nvme("0000:02:00.0", port="0000:00:03.0", slot="2", serial="SN2")
    harness.start()
    c = harness.client()
    c.wait_state(Harness.NVME, "HEALTHY")
    c.wait_state("0000:02:00.0", "HEALTHY")
    lease = c.ok("allocate", {"class": "0108", "count": 2})
    assert sorted(lease["devices"]) == [Harness.NVME, "0000:02:00.0"]
    assert c.call("allocate", {"class": "nvme"})["error"]["code"] == protocol.INSUFFICIENT_DEVICES


def test_lease_expires_after_a_short_ttl(harness):
    c = healthy_nvme(harness, lease_ttl_s=0.3, lease_check_ms=20)
    t0 = time.monotonic()
    lease = c.ok("allocate", {"device": Harness.NVME})
    gone = c.wait_event("deallocate", reason="lease_expired")
    assert gone["lease"] == lease["lease"]
    assert 0.25 <= time.monotonic() - t0 < 5.0
    c.wait(
        lambda m: (
            m.get("event") == "transition"
            and m["data"]["from"] == "RELEASED"
            and m["data"]["to"] == "HEALTHY"
        )
    )
    assert c.ok("leases")["leases"] == []


def test_with_no_lease_the_ticker_sleeps_until_the_health_poll(harness):
    """An idle runtime does not wake every lease_check_ms (issue 17: under TCG those wake-ups cost
    ~2% of a guest's CPU); the first grant wakes it (test_lease_expires_after_a_short_ttl: an hour's
    health poll there, and the lease still expires on time)."""
    c = healthy_nvme(harness, lease_check_ms=20)
    checks = []
    expire = harness.svc._expire_leases
    harness.svc._expire_leases = lambda: (checks.append(time.monotonic()), expire())
    time.sleep(0.5)
    assert checks == [], f"{len(checks)} lease checks in 0.5 s with no lease"
    lease = c.ok("allocate", {"device": Harness.NVME})
    time.sleep(0.3)
    assert len(checks) >= 5, f"{len(checks)} lease checks in 0.3 s while {lease['lease']} is held"


def test_renewed_lease_is_kept(harness):
    c = healthy_nvme(harness, lease_ttl_s=0.4, lease_check_ms=20)
    lease = c.ok("allocate", {"device": Harness.NVME})
    for _ in range(6):
        time.sleep(0.1)
        c.ok("renew", {"lease": lease["lease"]})
    assert not c.events("deallocate")
    assert c.ok("device", {"device": Harness.NVME})["state"] == "ALLOCATED"


# --- AER (LIFE-05, AER-01/02) --------------------------------------------------------------------
def recovery(harness: Harness, end: str, category: str = "nonfatal", at_port: bool = True):
    src = Harness.PORT if at_port else Harness.NVME
    harness.source.emit("change", Harness.NVME, ERROR_EVENT="BEGIN_RECOVERY", DEVICE_ONLINE="0")
    harness.fake.bump_aer(src, category, "DLP")
    harness.source.emit("change", Harness.NVME, ERROR_EVENT=end, DEVICE_ONLINE="1" if "SUCC" in end else "0")


def test_aer_counters_are_read_outside_the_service_lock_and_a_stale_read_is_dropped(harness):
    """The health poll's AER reads held the service lock 200-490 ms on a TCG guest, and a hot-add's
    `discovered` waited behind them (DISC-02, a100-stock). Reads now run without it; a read begun
    before one that was applied is dropped, never taken for a counter reset."""
    c = healthy_nvme(harness)
    svc = harness.svc
    sysfs = svc.sysfs
    original = sysfs.aer_counters
    reading, go_on, stale = threading.Event(), threading.Event(), {}

    def slow_read(bdf):
        counters = original(bdf)
        if threading.current_thread().name == "stale-poll" and bdf == Harness.PORT:
            stale.update(counters)
            reading.set()
            assert go_on.wait(10)
        return counters

    sysfs.aer_counters = slow_read
    try:
        poll = threading.Thread(target=svc._poll_aer, args=([Harness.NVME],), name="stale-poll")
        poll.start()
        assert reading.wait(10)
        assert svc._lock.acquire(timeout=2), "the service lock is held while AER counters are read"
        svc._lock.release()
        harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP", 2)  # counted on the device below it
        svc._poll_aer([Harness.NVME])  # a fresh read, applied first
        go_on.set()
        poll.join(10)
    finally:
        sysfs.aer_counters = original
    svc._poll_aer([Harness.NVME])  # a stale read applied would have made this count the 2 again
    counted = [e for e in c.events("aer", kind="counted", device=Harness.NVME)]
    assert [e["delta"]["nonfatal"] for e in counted] == [2], counted  # the stale read counted nothing


@pytest.mark.parametrize(("policy", "expected"), [("HEALTHY", None), ("DEGRADED", "DEGRADED")])
def test_recovered_nonfatal_error_is_counted_on_the_endpoint_and_follows_policy(harness, policy, expected):
    c = healthy_nvme(harness, aer={"nonfatal_recovered": policy})
    recovery(harness, "SUCCESSFUL_RECOVERY")
    rec = c.wait_event("aer", kind="recovered", device=Harness.NVME)
    assert rec["severity"] == "nonfatal" and rec["counts"]["nonfatal"] == 1  # port error, endpoint counted
    if expected:
        c.wait_state(Harness.NVME, expected)
    else:
        time.sleep(0.1)
        assert c.ok("device", {"device": Harness.NVME})["state"] == "HEALTHY"


def test_fatal_recovery_records_the_link_reset(harness):
    c = healthy_nvme(harness)
    recovery(harness, "SUCCESSFUL_RECOVERY", category="fatal")
    reset = c.wait_event("reset", device=Harness.NVME, source="kernel_aer")
    assert reset["outcome"] == "ok"
    c.wait_state(Harness.NVME, "DEGRADED")  # default fatal_recovered


def kernel_line(harness: Harness, text: str) -> None:
    """A kernel log line as the runtime's follower hands it over (the port printed it)."""
    harness.svc.on_kernel_event(parse_record(f"pcieport {Harness.PORT}: AER: {text}"))


FATAL_LINE = f"Uncorrected (Fatal) error message received from {Harness.PORT}"


def test_the_kernels_error_line_opens_the_recovery_window_before_udev_does(harness):
    """LIFE-03: from the moment the error is known (the kernel's line) the device is not HEALTHY for
    allocation, though udev's BEGIN_RECOVERY comes only when the kernel is done; AER-02: the reset's
    duration spans the window from that line."""
    c = healthy_nvme(harness)
    kernel_line(harness, FATAL_LINE)
    began = c.wait_event("aer", kind="begin_recovery", device=Harness.NVME)
    assert began["source"] == "kernel_log"
    assert c.call("allocate", {"device": Harness.NVME})["error"]["code"] == protocol.NOT_HEALTHY
    time.sleep(0.3)  # the kernel resets the link meanwhile
    recovery(harness, "SUCCESSFUL_RECOVERY", category="fatal")
    reset = c.wait_event("reset", device=Harness.NVME, source="kernel_aer")
    assert reset["duration_ms"] >= 300, reset
    assert len(c.events("aer", kind="begin_recovery", device=Harness.NVME)) == 1  # udev's is the same window
    c.wait_state(Harness.NVME, "DEGRADED")  # default fatal_recovered


def test_the_kernels_recovery_line_closes_nothing_udevs_late_outcome_does(harness):
    """udev broadcasts BEGIN_RECOVERY and the outcome after the kernel printed its recovery line: the
    window stays open until udev's outcome, so that outcome is never taken for another error's."""
    c = healthy_nvme(harness, aer={"nonfatal_recovered": "HEALTHY"})
    harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP")
    kernel_line(harness, f"Uncorrected (Non-Fatal) error message received from {Harness.PORT}")
    kernel_line(harness, "device recovery successful")
    assert c.call("allocate", {"device": Harness.NVME})["error"]["code"] == protocol.NOT_HEALTHY
    harness.source.emit("change", Harness.NVME, ERROR_EVENT="BEGIN_RECOVERY", DEVICE_ONLINE="0")
    harness.source.emit("change", Harness.NVME, ERROR_EVENT="SUCCESSFUL_RECOVERY", DEVICE_ONLINE="1")
    recovered = c.wait_event("aer", kind="recovered", device=Harness.NVME)
    assert recovered["source"] == "udev" and recovered["counts"]["nonfatal"] == 1, recovered
    c.ok("allocate", {"device": Harness.NVME})  # the window is closed: HEALTHY and free again
    assert len(c.events("aer", kind="begin_recovery", device=Harness.NVME)) == 1


def test_a_failed_recovery_with_no_beginning_still_faults(harness):
    """A driverless device: the kernel gives up at once (FAILED_RECOVERY, no BEGIN_RECOVERY), and
    without the kernel log nothing opened a window: the outcome is an episode of its own."""
    c = healthy_nvme(harness)
    harness.source.emit("change", Harness.NVME, ERROR_EVENT="FAILED_RECOVERY", DEVICE_ONLINE="0")
    c.wait_state(Harness.NVME, "FAULTED")
    assert c.wait_event("aer", kind="recovery_failed", device=Harness.NVME)["source"] == "udev"


def test_a_window_nobody_closes_is_closed_by_the_health_poll_after_its_grace(harness, monkeypatch):
    monkeypatch.setattr(health_watch, "RECOVERY_GRACE_NS", 200_000_000)  # read by health_poll
    c = healthy_nvme(harness, aer={"nonfatal_recovered": "HEALTHY"})
    kernel_line(harness, f"Uncorrected (Non-Fatal) error message received from {Harness.PORT}")
    assert c.call("allocate", {"device": Harness.NVME})["error"]["code"] == protocol.NOT_HEALTHY
    time.sleep(0.3)
    c.ok("health_poll", {"device": Harness.NVME})
    closed = c.wait_event("aer", kind="recovered", device=Harness.NVME)
    assert closed["source"] == "health_poll"
    c.ok("allocate", {"device": Harness.NVME})


def test_failed_recovery_faults_and_recover_needs_more_than_a_wish(harness):
    c = healthy_nvme(harness)
    lease = c.ok("allocate", {"device": Harness.NVME})
    recovery(harness, "FAILED_RECOVERY")
    c.wait_state(Harness.NVME, "FAULTED")
    dealloc = c.wait_event("deallocate", device=Harness.NVME)
    assert dealloc["lease"] == lease["lease"] and dealloc["reason"] == "faulted"
    assert c.call("allocate", {"device": Harness.NVME})["error"]["code"] == protocol.NOT_HEALTHY
    result = c.ok("recover", {"device": Harness.NVME})  # reset + self-check pass on the fake
    assert result["recovered"] is True
    c.wait(
        lambda m: (
            m.get("event") == "transition" and m["data"]["from"] == "FAULTED" and m["data"]["to"] == "HEALTHY"
        )
    )


def test_error_threshold_degrades_then_faults_and_recover_returns_healthy(harness):
    c = healthy_nvme(
        harness, aer={"half_life_s": 60.0, "degrade_weight": 1.5, "reset_weight": 50.0, "fault_weight": 3.5}
    )
    harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP", 2)
    c.ok("health_poll", {"device": Harness.NVME})
    c.wait_state(Harness.NVME, "DEGRADED")
    assert c.ok("recover", {"device": Harness.NVME})["recovered"] is True
    c.wait(
        lambda m: (
            m.get("event") == "transition"
            and m["data"]["from"] == "DEGRADED"
            and m["data"]["to"] == "HEALTHY"
        )
    )
    harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP", 2)
    c.ok("health_poll")
    c.wait_state(Harness.NVME, "DEGRADED")
    harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP", 3)
    c.ok("health_poll")
    c.wait_state(Harness.NVME, "FAULTED")
    assert c.call("recover", {"device": "0000:07:00.0"})["error"]["code"] == protocol.UNKNOWN_DEVICE


def test_sustained_error_rate_forces_a_reset_but_a_burst_does_not(harness):
    c = healthy_nvme(
        harness, aer={"half_life_s": 0.5, "degrade_weight": 100.0, "reset_weight": 3.0, "fault_weight": 200.0}
    )
    harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP", 2)  # a burst of two
    c.ok("health_poll")
    time.sleep(1.5)
    c.ok("health_poll")
    assert not c.events("reset")
    for _ in range(12):  # sustained: one error per 50 ms
        harness.fake.bump_aer(Harness.PORT, "nonfatal", "DLP", 1)
        c.ok("health_poll")
        time.sleep(0.05)
    reset = c.wait_event("reset", device=Harness.NVME, source="aer_sustained_rate")
    assert reset["outcome"] == "ok"
    assert harness.fake.read_attr(Harness.NVME, "reset").strip() == "1"


# --- lost configuration (RST-03) -------------------------------------------------------------
def test_lost_config_is_faulted_on_the_periodic_poll(harness):
    c = healthy_nvme(harness, health_poll_ms=50)
    harness.fake.lose_config(Harness.NVME)
    t = c.wait_state(Harness.NVME, "FAULTED")
    assert "config space reads all ones" in json.dumps(t["checkpoint"])
    time.sleep(0.2)
    assert c.ok("device", {"device": Harness.NVME})["state"] == "FAULTED"  # never back to HEALTHY


def test_cleared_bars_are_faulted_and_recovery_signal_does_not_hide_it(harness):
    c = healthy_nvme(harness)
    cleared = ConfigBuilder(command=0x0406)
    cleared.pcie(port_type=0, flr=True)
    harness.fake.set_config(Harness.NVME, cleared.build())  # IDs fine, BAR0 = 0
    recovery(harness, "SUCCESSFUL_RECOVERY")  # says "recovered": the worse signal wins
    t = c.wait_state(Harness.NVME, "FAULTED")
    assert "BAR0 cleared" in json.dumps(t["checkpoint"])


def test_allocate_checkpoint_catches_lost_config(harness):
    c = healthy_nvme(harness)
    harness.fake.set_mmio(Harness.NVME, 0, b"\xff" * 4096)
    reply = c.call("allocate", {"device": Harness.NVME})
    assert reply["error"]["code"] == protocol.NOT_HEALTHY
    c.wait_state(Harness.NVME, "FAULTED")


# --- protocol surface ---------------------------------------------------------------------------
def test_hello_transitions_stats_and_shutdown(harness):
    c = healthy_nvme(harness)
    hello = c.ok("hello", {"versions": [1], "client": "pytest"})
    assert hello["protocol"] == 1 and hello["pid"] == os.getpid()
    assert set(protocol.METHODS) <= set(hello["methods"])
    assert hello["config"]["drain_timeout_ms"] == 300
    assert c.call("hello", {"versions": [7]})["error"]["code"] == protocol.UNSUPPORTED_VERSION
    table = c.ok("transitions")
    assert {"from": "DISCOVERED", "to": "HEALTHY"} in table["views"]["health"]["transitions"]
    stats = c.ok("stats")
    assert stats["rss_kb"] > 0 and stats["devices"] == 1 and stats["events_dropped"] == 0
    inv = c.ok("inventory")
    assert inv["complete"] and [d["device"] for d in inv["devices"]] == [Harness.NVME]
    assert inv["devices"][0]["info"]["vendor_id"] == "1b36"
    assert c.ok("shutdown") == {"stopping": True}
    assert harness.svc.wait(TIMEOUT)


def test_every_event_is_well_formed_and_sequenced(harness):
    c = healthy_nvme(harness)
    c.ok("allocate", {"device": Harness.NVME})
    seqs = [m["seq"] for m in c.pump() if m["kind"] == "event"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for m in c.pump():
        if m["kind"] == "event":
            protocol.validate_event(m)


def test_subscribe_filter_and_unsubscribe(harness):
    harness.add_nvme()
    harness.start()
    c = harness.client(subscribe=False)
    c.ok("subscribe", {"events": ["lease"]})
    watcher = harness.client()
    watcher.wait_state(Harness.NVME, "HEALTHY")
    c.ok("allocate", {"device": Harness.NVME})
    c.wait_event("lease", action="granted")
    assert {m["event"] for m in c.pump() if m["kind"] == "event"} == {"lease"}
    c.ok("unsubscribe")
    n = len(c.pump())
    watcher.ok("release", {"lease": "L1"})
    watcher.wait_event("lease", action="released")
    assert len(c.pump()) == n


def test_bad_config_names_file_and_key(tmp_path):
    bad = tmp_path / "rt.toml"
    bad.write_text("drain_timout_ms = 5\n")
    with pytest.raises(ConfigError) as err:
        load(str(bad))
    assert str(bad) in str(err.value) and "drain_timout_ms" in str(err.value)
    bad.write_text('[aer]\nnonfatal_recovered = "MAYBE"\n')
    with pytest.raises(ConfigError, match="aer.nonfatal_recovered"):
        load(str(bad))
    bad.write_text('lease_ttl_s = "long"\n')
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        load(str(bad))
    from hilconform.runtime.__main__ import main

    assert main(["--config", str(bad)]) == 2


# --- real sockets: a client that stops reading blocks nobody --------------------------------------
def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(path)
    return s


def _rpc(sock: socket.socket, buf: bytearray, req_id: int, method: str, params=None) -> dict:
    sock.sendall(protocol.encode(protocol.request(req_id, method, params)))
    while True:
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            msg = protocol.decode_message(line)
            if msg.get("id") == req_id and msg["kind"] != "event":
                return msg
        chunk = sock.recv(65536)
        assert chunk, "runtime closed the connection"
        buf += chunk


def test_slow_client_does_not_block_another_and_drops_are_counted(tmp_path):
    h = Harness(tmp_path, serve=True, max_outgoing_bytes=32768)
    h.add_nvme()
    h.start()
    path = h.overrides["transport"].split(":", 1)[1]
    try:
        slow = _connect(path)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(protocol.encode(protocol.request(1, "subscribe", {})))
        time.sleep(0.2)
        for i in range(3000):  # far more than the socket buffers and the 32 KiB bound hold
            h.svc.emit("kernel", {"kind": "test", "line": "x" * 200, "i": i})
        fast, buf = _connect(path), bytearray()
        t0 = time.monotonic()
        for i in range(20):
            assert "result" in _rpc(fast, buf, i, "hello")
        assert time.monotonic() - t0 < 5.0
        stats = _rpc(fast, buf, 99, "stats")["result"]
        assert stats["events_dropped"] > 0
        slow.settimeout(TIMEOUT)  # now read everything: a "dropped" event must follow
        data, deadline = b"", time.monotonic() + TIMEOUT
        while b'"event":"dropped"' not in data and time.monotonic() < deadline:
            h.svc.emit("kernel", {"kind": "test", "line": "tick"})
            data += slow.recv(1 << 20)
        assert b'"event":"dropped"' in data
        oversized = b"x" * (protocol.MAX_LINE_BYTES + 10) + b"\n"
        fast.sendall(oversized)
        fast.sendall(protocol.encode(protocol.request(5, "hello")))
        err = protocol.decode_message(fast.recv(65536).split(b"\n")[0])
        assert err["kind"] == "error" and err["error"]["code"] == protocol.LINE_TOO_LONG
        assert "result" in _rpc(fast, bytearray(), 6, "hello")
    finally:
        h.stop()
    assert not os.path.exists(path)


def test_virtio_serial_port_over_a_pty_and_host_hangup(tmp_path):
    import tty

    master, slave = os.openpty()
    tty.setraw(slave)
    port = os.ttyname(slave)
    h = Harness(tmp_path, serve=True, transport=f"virtio-serial:{port}")
    h.add_nvme()
    h.start()
    try:
        os.write(master, protocol.encode(protocol.request(1, "hello")))
        data, deadline = b"", time.monotonic() + TIMEOUT
        while b"\n" not in data and time.monotonic() < deadline:
            os.set_blocking(master, False)
            try:
                data += os.read(master, 65536)
            except BlockingIOError:
                time.sleep(0.01)
        assert protocol.decode_message(data.split(b"\n")[0])["result"]["protocol"] == 1
        assert h.svc.server.sessions_opened == 1
    finally:
        os.close(master)
        deadline = time.monotonic() + TIMEOUT
        while h.svc.sessions and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not h.svc.sessions, "a hang-up ends the session"
        h.stop()
        os.close(slave)


def test_runtime_keeps_serving_while_procedures_run(harness):
    c = healthy_nvme(harness)
    threads = [threading.Thread(target=lambda: c.svc.health_poll(None, "t")) for _ in range(4)]
    for t in threads:
        t.start()
    assert "result" in c.call("hello")
    for t in threads:
        t.join(TIMEOUT)


# --- random operation sequences (LIFE-06 at unit level) --------------------------------------------
DEVS = {"0000:01:00.0": ("0000:00:02.0", "1"), "0000:02:00.0": ("0000:00:03.0", "2")}
op_strategy = st.tuples(
    st.sampled_from(
        [
            "allocate",
            "renew",
            "release",
            "aer_ok",
            "aer_fail",
            "remove",
            "surprise",
            "add",
            "reset",
            "recover",
            "poll",
            "lose_config",
        ]
    ),
    st.sampled_from(sorted(DEVS)),
)


def check_consistency(h: Harness, c: Client) -> None:
    svc = h.svc
    with svc._lock:
        svc.leases.check_invariants()
        for bdf, dev in svc.devices.items():
            held = svc.leases.holder_of(bdf) is not None
            assert held == (dev.states.health == "ALLOCATED"), (bdf, dev.states.health, held)
        for lease in svc.leases.all():
            assert all(b in svc.devices for b in lease.devices)
    assert svc.stats_counts["internal_errors"] == 0
    last: dict[tuple[str, str], str] = {}
    present: dict[str, bool] = {}
    for m in c.pump():
        if m["kind"] != "event":
            continue
        d = m["data"]
        if m["event"] == "discovered":
            last[(d["device"], "health")], last[(d["device"], "main")] = "DISCOVERED", "POWER_OFF"
            assert not present.get(d["device"]), f"{d['device']} discovered twice while present"
            present[d["device"]] = True
        elif m["event"] == "removed":
            present[d["device"]] = False
        elif m["event"] == "transition":
            key = (d["device"], d["view"])
            assert last.get(key) == d["from"], (key, last.get(key), d)
            assert svc.table.allowed(d["view"], d["from"], d["to"])
            last[key] = d["to"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy, min_size=3, max_size=14))
def test_random_sequences_keep_state_leases_and_events_consistent(tmp_path_factory, ops):
    h = Harness(tmp_path_factory.mktemp("seq"), hot_add_step_timeout_ms=100)
    for bdf, (port, slot) in DEVS.items():
        h.add_nvme(bdf, port=port, slot=slot, serial=f"S{slot}")
    h.start()
    c = h.client()
    try:
        for bdf in DEVS:
            c.wait_event("procedure", procedure="hot_add", device=bdf, step="end")
        for op, bdf in ops:
            exists = h.fake.sysfs.exists(bdf)
            leases = [lease.id for lease in h.svc.leases.all()]
            if op == "allocate":
                c.call("allocate", {"device": bdf})
            elif op == "renew" and leases:
                c.call("renew", {"lease": leases[0]})
            elif op == "release" and leases:
                c.call("release", {"lease": leases[-1]})
            elif op in ("aer_ok", "aer_fail") and exists and bdf in h.svc.devices:
                n = len(c.events("aer", device=bdf))
                h.source.emit("change", bdf, ERROR_EVENT="BEGIN_RECOVERY", DEVICE_ONLINE="0")
                end = "SUCCESSFUL_RECOVERY" if op == "aer_ok" else "FAILED_RECOVERY"
                h.source.emit("change", bdf, ERROR_EVENT=end, DEVICE_ONLINE="1")
                c.wait(lambda m, n=n, bdf=bdf: len(c.events("aer", device=bdf)) >= n + 2, what="aer events")
            elif op == "remove":
                c.call("remove", {"device": bdf})
            elif op == "surprise" and exists:
                h.fake.remove_device(bdf)
                h.source.emit("remove", bdf)
                c.wait(lambda m, bdf=bdf: bdf not in h.svc.devices, what="surprise removal")
            elif op == "add" and not exists:
                port, slot = DEVS[bdf]
                h.add_nvme(bdf, port=port, slot=slot, serial=f"S{slot}")
                n = len(c.events("procedure", procedure="hot_add", device=bdf, step="end"))
                h.source.emit("add", bdf)
                c.wait(
                    lambda m, n=n, bdf=bdf: (
                        len(c.events("procedure", procedure="hot_add", device=bdf, step="end")) > n
                    ),
                    what="hot add",
                )
            elif op == "reset":
                c.call("reset", {"device": bdf, "force": True})
            elif op == "recover":
                c.call("recover", {"device": bdf})
            elif op == "poll":
                c.call("health_poll")
            elif op == "lose_config" and exists:
                h.fake.lose_config(bdf)
            check_consistency(h, c)
        assert "result" in c.call("hello")
    finally:
        h.stop()


def test_hello_on_a_single_stream_port_starts_a_fresh_session(harness):
    c = healthy_nvme(harness)
    c.session.fresh_on_hello = True  # as the virtio-serial transport sets it
    before = len(c.pump())
    c.session.send(protocol.event("kernel", 1, 1, {"kind": "stale", "line": "old session"}), droppable=True)
    c.session.send(protocol.event("kernel", 2, 2, {"kind": "stale", "line": "old session"}), droppable=True)
    c.send_line(protocol.encode(protocol.request("h", "hello")))
    assert [m["kind"] for m in c.pump()[before:]] == ["reply"]  # stale output dropped
    assert not c.session.subscribed
    c.ok("allocate", {"device": Harness.NVME})
    assert not c.events("lease")  # unsubscribed by the hello


def test_discard_drops_events_but_keeps_replies_and_a_partly_written_line():
    session = Session(1, "t", 1 << 20, lambda: None)
    session.send(protocol.event("kernel", 1, 1, {"kind": "k", "line": "a"}), droppable=True)
    session.send(protocol.reply(7, {"x": 1}))
    session.send(protocol.event("kernel", 2, 2, {"kind": "k", "line": "b"}), droppable=True)
    session.consume(3)
    assert session.discard_events() == 1
    rest = b""
    while chunk := session.peek():
        session.consume(len(chunk))
        rest += chunk
    lines = rest.split(b"\n")
    assert b'"line":"a"' in lines[0] and protocol.decode_message(lines[1])["id"] == 7 and lines[2] == b""
    assert session.output_bytes() == 0
