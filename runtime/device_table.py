"""The device state core: the Device record, the devices table, its transitions and events.

Why its own module: every health or main state change of a device, whoever asks for it
(a request, the health watch, an arrival, a procedure), goes through ``_transition``
here, which moves it through the published transition table (lifecycle.py) and emits it
under the service lock, so events leave in the order the state changed. The end of an
allocation (release, expiry, revocation) lives here too: every part takes that path.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from . import procedures, protocol
from .aer import DeviceAer
from .device_classes import ClassHooks
from .inventory import DeviceInfo
from .lifecycle import DeviceStates, TransitionTable
from .own_resources import OwnResourcesShort
from .protocol import ProtocolError

_log = logging.getLogger("hilconform.runtime")


def log(msg: str) -> None:
    _log.info(msg)


class Device:
    """One managed PCI function while it is present."""

    def __init__(
        self,
        info: DeviceInfo,
        hooks: ClassHooks,
        table: TransitionTable,
        aer: DeviceAer,
        port: str | None,
    ):
        self.info = info
        self.hooks = hooks
        self.states = DeviceStates(table, info.bdf)
        self.aer = aer
        self.port = port
        self.busy: str | None = None  # procedure running on it
        self.isolated = False  # no new allocations (orderly removal)
        self.leaving = False  # removal: topology already updated
        self.gone = False
        self.resetting = False  # a sysfs reset is in flight: config access would block
        self.allocating = False  # an allocate is checking it (outside the lock): not free meanwhile
        self.pending_health: str | None = None  # a worse health seen during the self-check
        self.pending_removal: str | None = None  # attention button while another procedure ran
        self.last_checkpoint: dict | None = None
        self.identity_changed = False  # DISC-05: a different device appeared at this location
        # checks that could not run for want of the runtime's own resources, finished by a later poll
        self.release_cause: str | None = None  # RELEASED, its release checkpoint still to run
        self.hot_add_entry: str | None = None  # DISCOVERED, its self-check still to run
        self.recovery_ended_ns = -(1 << 62)  # when its last error recovery window closed
        self.last_cause = "discovered"
        self.since_ns = time.monotonic_ns()
        self._info_of: DeviceInfo | None = None
        self._info_fingerprint: str | None = None
        self._info_dict: dict = {}

    @property
    def bdf(self) -> str:
        return self.info.bdf

    def info_dict(self) -> dict:
        """``info.to_dict()``, kept while ``info`` is the same record: converting the parsed
        config space costs about 1 ms, and every ``inventory`` reports every device."""
        if self._info_of is not self.info or self._info_fingerprint != self.info.fingerprint:
            self._info_dict = self.info.to_dict()
            self._info_of, self._info_fingerprint = self.info, self.info.fingerprint
        return self._info_dict

    def available(self) -> bool:
        return (
            self.states.health == "HEALTHY"
            and not (self.isolated or self.leaving or self.gone or self.busy or self.resetting)
            and self.aer.recovering_since_ns is None
        )

    def free(self) -> bool:
        """Available and not being checked by another allocate."""
        return self.available() and not self.allocating


class DeviceTable:
    """The devices table and the state changes of its records, on the service's state and lock."""

    def emit(self, name: str, data: dict, ts_ns: int | None = None) -> dict:
        """Number, remember and broadcast one event (lock held by callers that change state)."""
        with self._lock:
            self._seq += 1
            msg = protocol.event(name, self._seq, ts_ns or time.monotonic_ns(), data)
            raw = protocol.encode(msg)
            self.history.append((self._seq, name, raw))
            self.stats_counts["events"] += 1
            for session in self.sessions.values():
                if session.subscribed and (session.event_filter is None or name in session.event_filter):
                    session.send_raw(raw, droppable=True)
            front_end = getattr(self, "front_end", None)  # the device-plugin front end, when enabled
            if front_end is not None:
                front_end.notify(name)
            return msg

    def _transition(self, dev: Device, moves) -> None:
        for t in moves:
            dev.last_cause, dev.since_ns = t.cause, t.ts_ns
            if t.view == "health":
                dev.last_checkpoint = t.checkpoint
            self.emit("transition", t.to_dict(), ts_ns=t.ts_ns)
            log(f"{t.device} {t.view} {t.frm} -> {t.to} ({t.cause})")

    def _move_health(self, dev: Device, to: str, cause: str, checkpoint: dict) -> None:
        self._transition(dev, dev.states.move_health(to, cause, checkpoint))

    def _apply_health(self, dev: Device, verdict: str, cause: str, checkpoint: dict) -> None:
        """Worse health wins: a signal only ever makes health worse (recover makes it better)."""
        current = dev.states.health
        if current == "REMOVED" or self.table.rank(verdict) <= self.table.rank(current):
            return
        if current == "DISCOVERED" and not self.table.allowed("health", current, verdict):
            dev.pending_health = self.table.worse(dev.pending_health or "HEALTHY", verdict)
            return  # applied when the self-check joins the device to the pool
        if current == "ALLOCATED":  # a degraded or faulted device is not held: ALLOCATED -> verdict
            self._revoke(dev, verdict.lower(), to_released=False)
        self._move_health(dev, verdict, cause, checkpoint)

    def _lookup(self, ident: str) -> Device:
        """A device by BDF ("0000:01:00.0" or "01:00.0") or fingerprint."""
        with self._lock:
            key = ident.lower()
            if len(key) == 7 and key[2] == ":":
                key = f"0000:{key}"
            dev = self.devices.get(key)
            if dev is None:
                dev = next((d for d in self.devices.values() if d.info.fingerprint == key), None)
            if dev is None:
                raise ProtocolError(protocol.UNKNOWN_DEVICE, f"no managed device {ident[:80]!r}")
            return dev

    def _known_sources(self) -> set[str]:
        return {d.bdf for d in self.devices.values()} | {d.port for d in self.devices.values() if d.port}

    def _topology(self, cause: str, **extra: Any) -> dict:
        self.generation += 1
        devices = sorted(b for b, d in self.devices.items() if not (d.leaving or d.gone))
        self.emit("topology", {"generation": self.generation, "devices": devices, "cause": cause, **extra})
        return {"generation": self.generation, "devices": len(devices)}

    def _revoke(self, dev: Device, reason: str, to_released: bool = True) -> list[dict]:
        """Take the device from its lease: DEALLOCATE to the holder, ALLOCATED -> RELEASED."""
        lease = self.leases.revoke_device(dev.bdf)
        if lease is None:
            return []
        self.emit(
            "deallocate",
            {"device": dev.bdf, "lease": lease.id, "holder": lease.holder, "reason": reason},
        )
        self.emit("lease", {**lease.to_dict(), "action": "revoked", "device": dev.bdf, "reason": reason})
        if to_released and dev.states.health == "ALLOCATED":
            self._move_health(dev, "RELEASED", f"deallocate:{reason}", {"name": "deallocate", "ok": True})
        return [{"lease": lease.id, "holder": lease.holder}]

    def _release_for(self, dev: Device, reason: str) -> None:
        """Revoke the lease of a device about to be reset: DEALLOCATE, then the release path."""
        if self._revoke(dev, reason, to_released=False) and dev.states.health == "ALLOCATED":
            self._end_allocation(dev, f"deallocate:{reason}")

    def _end_allocation(self, dev: Device, cause: str) -> None:
        """ALLOCATED -> RELEASED now (lock held); -> HEALTHY once the release checkpoint passed, on
        a thread of its own: the checkpoint reads config space, which blocks while a link is reset,
        and the service lock must never wait on a device."""
        self._move_health(dev, "RELEASED", cause, {"name": "release", "ok": True})
        if dev.isolated or dev.leaving or dev.gone:
            return
        dev.release_cause = cause
        threading.Thread(target=self._release_checkpoint, args=(dev,), name="release", daemon=True).start()

    def _release_checkpoint(self, dev: Device) -> None:
        try:
            checkpoint = procedures.config_intact(self.sysfs, dev.bdf, dev.info)
        except OwnResourcesShort as exc:  # it stays RELEASED (out of the pool); the next poll finishes it
            self.own_errors.inconclusive(exc, f"{dev.bdf} release checkpoint")
            return
        with self._lock:
            if self.devices.get(dev.bdf) is dev and dev.release_cause and dev.states.health == "RELEASED":
                self._finish_release(dev, dev.release_cause, checkpoint)

    def _finish_release(self, dev: Device, cause: str, checkpoint: dict) -> None:
        """RELEASED -> HEALTHY when the release checkpoint passed, else DEGRADED/FAULTED (lock held).

        The way back to HEALTHY is the checkpoint's, not the release's (LIFE-01: the table lets
        only `release_checkpoint` take RELEASED -> HEALTHY), so its cause names the checkpoint
        and keeps the release's after it (``release_checkpoint:release:L3``)."""
        dev.release_cause = None
        verdict = dev.aer.verdict(time.monotonic_ns())
        target = self.table.worse(verdict.health, "HEALTHY" if checkpoint["ok"] else "FAULTED")
        if target == "HEALTHY":
            self._move_health(dev, "HEALTHY", f"release_checkpoint:{cause}", checkpoint)
        else:
            self._move_health(
                dev, target, f"{cause}:checkpoint", {**checkpoint, "aer_weight": verdict.weight}
            )

    def _expire_leases(self) -> None:
        with self._lock:
            for lease in self.leases.expired(time.monotonic_ns()):
                self.emit("lease", {**lease.to_dict(), "action": "expired"})
                for bdf in lease.devices:
                    dev = self.devices.get(bdf)
                    self.emit(
                        "deallocate",
                        {
                            "device": bdf,
                            "lease": lease.id,
                            "holder": lease.holder,
                            "reason": "lease_expired",
                        },
                    )
                    if dev and dev.states.health == "ALLOCATED":
                        self._end_allocation(dev, "lease_expired")
