"""The method table: one ``_m_<method>`` handler per protocol method (protocol.METHODS).

Why its own module: ``Service.handle_line`` decodes a request and calls ``_m_<method>``;
each handler here checks its parameters, takes the lock for what it reads or changes,
and returns the result, or SENT when it replied itself (subscribe) or a worker will
(remove, reset, recover, health_poll). docs/protocol.md describes each method.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Any

from . import procedures, protocol
from .device_table import Device, log
from .protocol import ProtocolError
from .transport import Session

RUNTIME_VERSION = "0.1.0"
SENT = object()  # a handler already replied (or will reply from a worker)

_log = logging.getLogger("hilconform.runtime")


class RequestMethods:
    """The protocol's request handlers, on the service's state."""

    def _m_hello(self, session: Session, req: protocol.Request) -> dict:
        if session.fresh_on_hello:
            with self._lock:
                stale = session.discard_events()
                session.subscribed, session.event_filter = False, None
            if stale:
                log(f"session {session.id}: hello started a fresh session ({stale} stale message(s) dropped)")
        versions = req.params.get("versions")
        if versions is not None and protocol.PROTOCOL_VERSION not in versions:
            raise ProtocolError(
                protocol.UNSUPPORTED_VERSION,
                "no common protocol version",
                req.id,
                {"supported": list(protocol.SUPPORTED_VERSIONS)},
            )
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "versions": list(protocol.SUPPORTED_VERSIONS),
            "runtime": self.cfg.name,
            "runtime_version": RUNTIME_VERSION,
            "pid": os.getpid(),
            "session": session.id,
            "started_ns": self.started_ns,
            "now_ns": time.monotonic_ns(),
            "max_line_bytes": protocol.MAX_LINE_BYTES,
            "methods": sorted(protocol.METHODS),
            "events": sorted(protocol.EVENTS),
            "config": self.cfg.summary(),
        }

    def _device_dict(self, dev: Device) -> dict:
        lease = self.leases.holder_of(dev.bdf)
        return {
            "device": dev.bdf,
            "fingerprint": dev.info.fingerprint,
            "state": dev.states.health,
            "main_state": dev.states.main,
            "in_pool": dev.available(),
            "lease": lease.id if lease else None,
            "holder": lease.holder if lease else None,
            "busy": dev.busy,
            "isolated": dev.isolated,
            "leaving": dev.leaving,
            "identity_changed": dev.identity_changed,
            "class": dev.hooks.name,
            "port": dev.port,
            "slot": dev.info.slot,
            "last_cause": dev.last_cause,
            "since_ns": dev.since_ns,
            "last_checkpoint": dev.last_checkpoint,
            "aer": dev.aer.to_dict(time.monotonic_ns()),
            "info": dev.info_dict(),
        }

    def _m_inventory(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            return {
                "complete": self.inventory_complete,
                "generation": self.generation,
                "devices": [self._device_dict(d) for _, d in sorted(self.devices.items())],
            }

    def _m_device(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            return self._device_dict(self._lookup(req.params["device"]))

    def _m_transitions(self, session: Session, req: protocol.Request) -> dict:
        return self.table.to_dict()

    def _m_subscribe(self, session: Session, req: protocol.Request):
        names = req.params.get("events")
        if names is not None:
            unknown = [n for n in names if not isinstance(n, str) or n not in protocol.EVENTS]
            if unknown or not names:
                raise ProtocolError(
                    protocol.INVALID_PARAMS, f"subscribe: unknown event names {unknown[:5]}", req.id
                )
        since = req.params.get("since_seq")
        with self._lock:  # reply, replay and go live atomically: no event is missed or doubled
            event_filter = frozenset(names) if names is not None else None
            replay = [
                raw
                for seq, name, raw in self.history
                if since is not None and seq > since and (event_filter is None or name in event_filter)
            ]
            oldest = self.history[0][0] if self.history else self._seq + 1
            session.send_reply(
                protocol.reply(
                    req.id, {"seq": self._seq, "replayed": len(replay), "history_starts_at": oldest}
                )
            )
            session.send_events(replay)
            session.event_filter = event_filter
            session.subscribed = True
        return SENT

    def _m_unsubscribe(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            session.subscribed = False
            session.event_filter = None
        return {"subscribed": False}

    def _m_allocate(self, session: Session, req: protocol.Request) -> dict:
        p = req.params
        if ("device" in p) == ("class" in p):
            raise ProtocolError(
                protocol.INVALID_PARAMS, "allocate: give exactly one of device, class", req.id
            )
        count = p.get("count", 1)
        if count < 1 or ("device" in p and count != 1):
            raise ProtocolError(
                protocol.INVALID_PARAMS, "allocate: count must be >= 1 (1 with device)", req.id
            )
        holder = p.get("holder") or f"session-{session.id}"
        with self._lock:
            chosen = self._choose(p, count, req.id)
            for dev in chosen:
                dev.allocating = True
        # The checkpoint reads config space, which blocks while the kernel resets a link: never
        # under the service lock (every other request and event would wait behind it).
        try:
            checkpoints = {dev.bdf: procedures.config_intact(self.sysfs, dev.bdf, dev.info) for dev in chosen}
        except BaseException:
            with self._lock:
                for dev in chosen:
                    dev.allocating = False
            raise
        with self._lock:
            for dev in chosen:
                dev.allocating = False
            for dev in chosen:
                if not checkpoints[dev.bdf]["ok"]:
                    self._apply_health(dev, "FAULTED", "allocate:checkpoint", checkpoints[dev.bdf])
                    raise ProtocolError(
                        protocol.NOT_HEALTHY,
                        f"{dev.bdf} failed its checkpoint: {checkpoints[dev.bdf]['problems']}",
                        req.id,
                        {"state": "FAULTED"},
                    )
                if self.devices.get(dev.bdf) is not dev or not dev.available():
                    # it changed while it was checked (an error's recovery began, a removal, ...)
                    raise _not_healthy(dev, req.id, " since the request came")
            lease = self.leases.grant(holder, [d.bdf for d in chosen], time.monotonic_ns(), p.get("ttl_s"))
            for dev in chosen:
                self._move_health(dev, "ALLOCATED", f"allocate:{lease.id}", checkpoints[dev.bdf])
            self.emit("lease", {**lease.to_dict(), "action": "granted"})
            self._tick_wake.set()  # the ticker watches leases from now on
            return lease.to_dict()

    def _choose(self, p: dict, count: int, req_id) -> list[Device]:
        """The devices an allocate asks for, if free now (lock held); refusals as ProtocolError."""
        if "device" in p:
            dev = self._lookup(p["device"])
            lease = self.leases.holder_of(dev.bdf)
            if lease is not None:
                raise ProtocolError(protocol.DEVICE_BUSY, f"{dev.bdf} is held by lease {lease.id}", req_id)
            if dev.allocating:
                raise ProtocolError(
                    protocol.DEVICE_BUSY, f"{dev.bdf} is being allocated by another request", req_id
                )
            if not dev.available():
                raise _not_healthy(dev, req_id)
            return [dev]
        chosen = [
            d
            for _, d in sorted(self.devices.items())
            if d.free() and self.leases.holder_of(d.bdf) is None and _class_matches(d, p["class"])
        ]
        if len(chosen) < count:
            raise ProtocolError(
                protocol.INSUFFICIENT_DEVICES,
                f"{len(chosen)} HEALTHY free device(s) of class {p['class']!r}, {count} asked",
                req_id,
                {"available": len(chosen)},
            )
        return chosen[:count]

    def _m_renew(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            lease = self.leases.renew(req.params["lease"], time.monotonic_ns(), req.params.get("ttl_s"))
            for bdf in lease.devices:
                dev = self.devices.get(bdf)
                if dev and dev.states.main == "ALLOCATED":
                    self._move_main(dev, "RUNNING", f"renew:{lease.id}", {"name": "renew", "ok": True})
            self.emit("lease", {**lease.to_dict(), "action": "renewed"})
            return lease.to_dict()

    def _m_release(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            lease = self.leases.release(req.params["lease"])
            self.emit("lease", {**lease.to_dict(), "action": "released"})
            for bdf in lease.devices:
                dev = self.devices.get(bdf)
                if dev and dev.states.health == "ALLOCATED":
                    self._end_allocation(dev, f"release:{lease.id}")
            return {**lease.to_dict(), "released": True}

    def _m_leases(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            return {
                "leases": [lease.to_dict() for lease in self.leases.all()],
                "now_ns": time.monotonic_ns(),
            }

    def _deferred(self, session: Session, req: protocol.Request):
        def done(result: Any) -> None:
            if isinstance(result, dict) and "internal_error" in result:
                session.send_reply(protocol.error(req.id, protocol.INTERNAL, result["internal_error"]))
            else:
                session.send_reply(protocol.reply(req.id, result))

        return done

    def _lookup_idle(self, req: protocol.Request) -> Device:
        """The request's device, refused with DEVICE_BUSY while a procedure runs on it."""
        dev = self._lookup(req.params["device"])
        if dev.busy or dev.leaving:
            raise ProtocolError(
                protocol.DEVICE_BUSY, f"{dev.bdf}: {dev.busy or 'removal'} in progress", req.id
            )
        return dev

    def _m_remove(self, session: Session, req: protocol.Request):
        with self._lock:
            dev = self._lookup_idle(req)
            self._start_removal(dev, "request", self._deferred(session, req))
        return SENT

    def _m_reset(self, session: Session, req: protocol.Request):
        with self._lock:
            dev = self._lookup_idle(req)
            if self.leases.holder_of(dev.bdf) is not None:
                if not req.params.get("force"):
                    raise ProtocolError(
                        protocol.DEVICE_BUSY, f"{dev.bdf} is allocated; pass force=true", req.id
                    )
                self._release_for(dev, "reset")
            self._start(
                dev,
                "reset",
                "request",
                lambda run: procedures.reset_procedure(self, run, dev.info),
                self._deferred(session, req),
            )
        return SENT

    def _m_recover(self, session: Session, req: protocol.Request):
        with self._lock:
            dev = self._lookup_idle(req)
            state = dev.states.health
            if state not in ("DEGRADED", "FAULTED"):
                raise ProtocolError(
                    protocol.INVALID_STATE,
                    f"{dev.bdf} is {state}; recover needs DEGRADED or FAULTED",
                    req.id,
                    {"state": state},
                )
            self._start(
                dev,
                "recover",
                "request",
                lambda run: procedures.recover_procedure(self, run, dev.info, dev.hooks, state == "FAULTED"),
                self._deferred(session, req),
            )
        return SENT

    def _m_health_poll(self, session: Session, req: protocol.Request):
        bdfs = [self._lookup(req.params["device"]).bdf] if "device" in req.params else None
        done = self._deferred(session, req)

        def poll() -> None:
            try:
                result = {"devices": self.health_poll(bdfs, "health_poll:request")}
            except Exception as exc:  # noqa: BLE001 - the request still gets its one reply
                self.stats_counts["internal_errors"] += 1
                _log.error(f"health_poll request failed: {exc!r}\n{traceback.format_exc()}")
                result = {"internal_error": f"internal error: {exc!r}"[:300]}
            done(result)

        self.workers.submit(session.id, poll)  # a few threads, fair between sessions
        return SENT

    def _m_stats(self, session: Session, req: protocol.Request) -> dict:
        with self._lock:
            live_dropped = sum(s.dropped_total for s in self.sessions.values())
            try:
                fds = len(os.listdir("/proc/self/fd"))
            except OSError:
                fds = None
            return {
                "rss_kb": _rss_kb(),
                "uptime_s": round((time.monotonic_ns() - self.started_ns) / 1e9, 3),
                "events_emitted": self.stats_counts["events"],
                "seq": self._seq,
                "events_dropped": live_dropped + self.stats_counts["dropped_closed_sessions"],
                "requests": self.stats_counts["requests"],
                "errors": self.stats_counts["errors"],
                "internal_errors": self.stats_counts["internal_errors"],
                "sessions": len(self.sessions),
                "devices": len(self.devices),
                "leases": len(self.leases.all()),
                "threads": threading.active_count(),
                "clients_refused": self.server.clients_refused if self.server else 0,
                "inconclusive_checks": self.own_errors.total,
                "open_fds": fds,
                "topology_generation": self.generation,
            }

    def _m_shutdown(self, session: Session, req: protocol.Request) -> dict:
        threading.Timer(0.05, self.request_stop, args=("shutdown request",)).start()
        return {"stopping": True}


def _not_healthy(dev: Device, req_id, when: str = "") -> ProtocolError:
    """The refusal of an allocate whose device is not allocatable: its state and why."""
    return ProtocolError(
        protocol.NOT_HEALTHY,
        f"{dev.bdf} is {dev.states.health}{_why_unavailable(dev)}{when}; only HEALTHY devices are allocated",
        req_id,
        {"state": dev.states.health, "busy": dev.busy},
    )


def _why_unavailable(dev: Device) -> str:
    """Why a device in any health state is not allocatable now, as a parenthesised note ("" if none)."""
    notes = [f"{dev.busy} running"] if dev.busy else []
    if dev.isolated or dev.leaving:
        notes.append("being removed")
    if dev.resetting:
        notes.append("being reset")
    if dev.aer.recovering_since_ns is not None:
        notes.append("error recovery under way")
    return f" ({', '.join(notes)})" if notes else ""


def _class_matches(dev: Device, wanted: str) -> bool:
    """A class by hex prefix ("0108"), hooks name ("nvme") or IDs ("1b36:0010", "10de:*")."""
    wanted = wanted.lower()
    info = dev.info
    if wanted in (dev.hooks.name, info.ids, f"{info.vendor_id:04x}:*"):
        return True
    is_hex_prefix = wanted != "" and all(c in "0123456789abcdef" for c in wanted)
    return is_hex_prefix and f"{info.class_code:06x}".startswith(wanted)


def _rss_kb() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
