"""The runtime's service: its threads, sessions and state, joined under one lock.

Why one lock: state changes come from five threads (I/O, discovery, kernel
log, ticker, procedure workers). Every state change and every event emission
happens under ``self._lock``, so events leave in the order the state changed
and no two threads can allocate one device. Anything that can block (drain,
reset, power-off) runs on a worker without the lock (see procedures.py).

Why mixins: ``Service`` owns the state and the threads (built here) and takes its
behaviour, one idea a module, from the classes it inherits: the device state core
(device_table.py), ``procedures.Host`` (procedure_host.py), arrivals (arrival.py),
the health watch (health_watch.py), the kernel log's reaction (kernel_reaction.py)
and the protocol's method table (request_methods.py). Every method stays an
attribute of ``Service``, so a test or mutant patches ``Service.<method>``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import traceback
from collections import deque
from typing import Any

from . import procedures, protocol  # noqa: F401 - procedures: a patch point (service.procedures)
from .aer import AerPolicy, CounterDeltas
from .arrival import SELF_CHECK_DEFER_S, DeviceArrival
from .config import Config
from .device_table import Device, DeviceTable, log
from .discovery import DiscoveryWatcher, PciChange, QueueChangeSource, UdevChangeSource
from .health_watch import LATE_ERROR_LINE_NS, RECOVERY_GRACE_NS, HealthWatch
from .inventory import IdentityRegistry
from .kernel_log import KernelLogFollower
from .kernel_reaction import KernelLogReaction
from .leases import LeaseError, LeaseTable
from .lifecycle import IllegalTransition, TransitionTable
from .own_resources import EpisodeLog, OwnResourcesShort
from .procedure_host import ProcedureHost
from .protocol import ProtocolError
from .request_methods import RUNTIME_VERSION, SENT, RequestMethods
from .selector import Selector
from .sysfs import Sysfs
from .transport import Server, Session
from .uevent_socket import KernelUeventSource
from .workers import FairWorkerPool

HISTORY = 2048  # events kept for subscribe(since_seq=...)


_log = logging.getLogger("hilconform.runtime")


class Service(RequestMethods, HealthWatch, KernelLogReaction, DeviceArrival, ProcedureHost, DeviceTable):
    """The runtime: builds its state, starts and stops its threads, answers its sessions."""

    def __init__(
        self,
        cfg: Config,
        sysfs: Sysfs | None = None,
        change_source=None,
        kernel_log_path: str | None = None,
    ):
        self.cfg = cfg
        self.sysfs = sysfs or Sysfs(cfg.sysfs_root)
        self.table = TransitionTable.load()
        self.selector = Selector.from_config(cfg.selector)
        self.policy = AerPolicy.from_config(cfg.aer)
        self.leases = LeaseTable(cfg.lease_ttl_s)
        self.identities = IdentityRegistry(cfg.identity_store or None)
        self.devices: dict[str, Device] = {}
        self.sessions: dict[int, Session] = {}
        self.history: deque[tuple[int, str, bytes]] = deque(maxlen=HISTORY)  # (seq, name, line)
        self._lock = threading.RLock()
        self._seq = 0
        self._runs = itertools.count(1)
        self._counter = CounterDeltas()
        self._aer_reads = itertools.count(1)  # each AER counter read's number, taken under the lock
        self._aer_applied: dict[str, int] = {}  # source -> the number of the latest read applied
        self._stop = threading.Event()
        self._tick_wake = threading.Event()  # the ticker: a stop, or leases to watch (_tick)
        self._threads: list[threading.Thread] = []
        self.generation = 0
        self.inventory_complete = False
        self.started_ns = time.monotonic_ns()
        self.stats_counts = {
            "requests": 0,
            "errors": 0,
            "events": 0,
            "dropped_closed_sessions": 0,
            "internal_errors": 0,
        }
        if change_source is None:
            change_source = _change_source(cfg)
        self.watcher = DiscoveryWatcher(
            self.sysfs,
            self.selector,
            cfg.batch_window_ms / 1000.0,
            self._on_batch,
            source=change_source,
            on_change=self._on_change,
        )
        path = cfg.kernel_log if kernel_log_path is None else kernel_log_path
        self.kernel_log = KernelLogFollower(path, self.on_kernel_event) if path else None
        self.server: Server | None = None
        self.workers = FairWorkerPool(cfg.request_workers, "request")  # blocking request work
        self.own_errors = EpisodeLog()  # checks left inconclusive by fd/memory exhaustion
        self._pending_adds: dict[str, PciChange] = {}  # hot-adds that could not be described yet
        self.front_end = None
        if cfg.device_plugin:  # imported only when enabled: the core needs no grpcio
            from .deviceplugin.front_end import DevicePluginFrontEnd

            self.front_end = DevicePluginFrontEnd(self, cfg)

    # == start / stop ====================================================================
    def start(self, serve: bool = True) -> None:
        self.workers.start()
        if serve:
            self.server = Server(
                self,
                self.cfg.transport,
                self.cfg.max_outgoing_bytes,
                max_clients=self.cfg.max_clients,
                max_in_flight=self.cfg.max_requests_in_flight,
                fd_reserve=self.cfg.client_fd_reserve,
            )
            self.server.start()
        if self.kernel_log:
            self.kernel_log.start()
        t0 = time.monotonic_ns()
        infos = self.watcher.enumerate()
        for info in infos:
            self._add_device(info, "boot", None)
        with self._lock:
            self.inventory_complete = True
            self.emit(
                "inventory_complete",
                {
                    "devices": len(infos),
                    "duration_ms": round((time.monotonic_ns() - t0) / 1e6, 3),
                    "bdfs": sorted(d.bdf for d in infos),
                },
            )
            self._topology("boot")
        self.watcher.start()
        if self.front_end is not None:
            self.front_end.start()
        ticker = threading.Thread(target=self._tick, name="ticker", daemon=True)
        ticker.start()
        self._threads.append(ticker)
        log(f"started: {len(infos)} device(s), transport {self.cfg.transport}, pid {os.getpid()}")

    def request_stop(self, reason: str = "requested") -> None:
        if not self._stop.is_set():
            with self._lock:
                self.emit("shutdown", {"reason": reason})
            self._stop.set()
            self._tick_wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        self._tick_wake.set()
        if self.front_end is not None:
            self.front_end.stop()
        self.watcher.stop()
        if self.kernel_log:
            self.kernel_log.stop()
        for t in self._threads:
            t.join(timeout=2)
        self.workers.stop()
        if self.server:
            self.server.stop()
        log("stopped")

    # == sessions (transport callbacks) ==================================================
    def open_session(self, session: Session) -> None:
        with self._lock:
            self.sessions[session.id] = session
        log(f"session {session.id} opened ({session.peer})")

    def close_session(self, session: Session) -> None:
        with self._lock:
            if self.sessions.pop(session.id, None) is not None:
                self.stats_counts["dropped_closed_sessions"] += session.dropped_total

    def on_drained(self, session: Session) -> None:
        """Space returned in a client's buffer: tell it how many events it lost."""
        with self._lock:
            count, session.dropped_pending = session.dropped_pending, 0
            if count:
                self._seq += 1
                session.send(
                    protocol.event(
                        "dropped",
                        self._seq,
                        time.monotonic_ns(),
                        {"count": count, "total": session.dropped_total},
                    )
                )

    def handle_line(self, session: Session, line: bytes) -> None:
        """Answer one request line; never raises (a bug becomes an INTERNAL error reply)."""
        req_id = None
        try:
            self.stats_counts["requests"] += 1
            req = protocol.decode_request(line)
            req_id = req.id
            if self._stop.is_set() and req.method not in ("hello", "stats"):
                raise ProtocolError(protocol.SHUTTING_DOWN, "the runtime is stopping", req.id)
            result = getattr(self, f"_m_{req.method}")(session, req)
            if result is not SENT:
                session.send_reply(protocol.reply(req.id, result))
        except ProtocolError as exc:
            self._error(
                session,
                exc.req_id if exc.req_id is not None else req_id,
                exc.code,
                exc.message,
                exc.data,
            )
        except LeaseError as exc:
            self._error(session, req_id, exc.code, str(exc))
        except OwnResourcesShort as exc:
            self.own_errors.inconclusive(exc, "request")
            self._error(session, req_id, protocol.RESOURCE_EXHAUSTED, f"the runtime lacks resources: {exc}")
        except Exception as exc:  # noqa: BLE001 - the runtime keeps serving
            self.stats_counts["internal_errors"] += 1
            _log.error(f"internal error on {line[:200]!r}: {exc!r}\n{traceback.format_exc()}")
            self._error(session, req_id, protocol.INTERNAL, f"internal error: {exc!r}"[:300])

    def _error(
        self, session: Session, req_id: Any, code: str, message: str, data: dict | None = None
    ) -> None:
        self.stats_counts["errors"] += 1
        session.send_reply(protocol.error(req_id, code, message, data))

    # == periodic work ===================================================================
    def _tick(self) -> None:
        """Lease expiry every `lease_check_ms` while there are leases, the health poll every
        `health_poll_ms`. With no lease it sleeps until the poll (a grant wakes it): a tick every
        100 ms cost an idle TCG guest ~2% of its CPU for nothing (issue 17)."""
        lease_s = self.cfg.lease_check_ms / 1000.0
        poll_s = self.cfg.health_poll_ms / 1000.0
        next_poll = time.monotonic() + poll_s
        while True:
            with self._lock:
                watching = bool(self.leases.all())
            wait_s = max(0.0, next_poll - time.monotonic())
            self._tick_wake.wait(min(lease_s, wait_s) if watching else wait_s)
            self._tick_wake.clear()
            if self._stop.is_set():
                return
            try:
                self._expire_leases()
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + poll_s
                    self._retry_pending_adds()
                    self.health_poll(None, "health_poll")
            except OwnResourcesShort as exc:
                self.own_errors.inconclusive(exc, "ticker")
            except Exception as exc:  # noqa: BLE001 - the ticker must survive a bug
                self.stats_counts["internal_errors"] += 1
                _log.error(f"ticker: {exc!r}\n{traceback.format_exc()}")


def _change_source(cfg: Config):
    """Where device changes come from: the kernel's uevents (default), udevd's, or nothing."""
    if not cfg.udev:
        return QueueChangeSource()  # nothing feeds it: no udev on this host
    if cfg.uevent_source == "kernel":
        return KernelUeventSource()
    return UdevChangeSource(source="udev")


__all__ = [
    "Service",
    "Device",
    "IllegalTransition",
    "HISTORY",
    "RUNTIME_VERSION",
    "SENT",
    "RECOVERY_GRACE_NS",
    "LATE_ERROR_LINE_NS",
    "SELF_CHECK_DEFER_S",
    "log",
]
