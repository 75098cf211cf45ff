"""The service as ``procedures.Host``: what a procedure may ask of it, and the procedure threads.

Why its own module: procedures.py runs hot-add, hot-remove, reset and recover on worker
threads and sees the service only through ``procedures.Host``. These are that interface's
methods (each takes the lock itself) and ``_start``, which runs one procedure per device
at a time on its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

from . import procedures
from .device_table import Device, log
from .own_resources import OwnResourcesShort

_log = logging.getLogger("hilconform.runtime")


class ProcedureHost:
    """``procedures.Host`` on the service's devices table, and the threads procedures run on."""

    def _start(self, dev: Device, name: str, entry: str, work, on_done=None):
        """Run a procedure on a worker thread; one procedure per device at a time (lock held)."""
        dev.busy = name
        run = procedures.Run(name, f"{name}-{next(self._runs)}", dev.bdf, entry, time.monotonic_ns(), dev)

        def body() -> None:
            result: Any = None
            try:
                result = work(run)
            except Exception as exc:  # noqa: BLE001
                self.stats_counts["internal_errors"] += 1
                _log.error(f"{run.run_id} failed: {exc!r}\n{traceback.format_exc()}")
                result = {"internal_error": f"{exc!r}"[:300]}
                self.step(run, "end", "failed", error=result["internal_error"])
            finally:
                with self._lock:
                    if dev.busy == name:
                        dev.busy = None
                    pending, dev.pending_removal = dev.pending_removal, None
                    if pending and not dev.gone and self.devices.get(dev.bdf) is dev:
                        self._start_removal(dev, pending)
            if on_done:
                on_done(result)

        threading.Thread(target=body, name=run.run_id, daemon=True).start()
        return run

    def _start_removal(self, dev: Device, entry: str, on_done=None):
        return self._start(
            dev,
            "hot_remove",
            entry,
            lambda run: procedures.hot_remove(self, run, dev.info, dev.hooks),
            on_done,
        )

    def step(self, run: procedures.Run, step: str, status: str, **detail: Any) -> None:
        data = {
            "procedure": run.procedure,
            "run": run.run_id,
            "device": run.device,
            "entry": run.entry,
            "step": step,
            "status": status,
            "ts_ns": time.monotonic_ns(),
            **detail,
        }
        self.emit("procedure", data, ts_ns=data["ts_ns"])
        if step not in ("begin",):
            log(
                f"{run.device} {run.run_id} {step}: {status}"
                + (f" ({detail.get('error')})" if detail.get("error") else "")
            )

    def _own(self, run: procedures.Run) -> Device | None:
        """The record ``run`` works on, while it is still the one at its address (lock held).

        Why not the address alone: under load a slot's power-off write can return after the
        kernel removed the card and the next card in that slot was discovered; the old run's
        last steps (its removal's end, a late reset outcome) must not land on the new record."""
        dev = self.devices.get(run.device)
        return dev if dev is run.record and not dev.gone else None

    def set_resetting(self, run: procedures.Run, resetting: bool) -> None:
        with self._lock:
            dev = self._own(run)
            if dev:
                dev.resetting = resetting

    def is_resetting(self, run: procedures.Run) -> bool:
        with self._lock:
            dev = self._own(run)
            return bool(dev and dev.resetting)

    def is_gone(self, run: procedures.Run) -> bool:
        with self._lock:
            return self._own(run) is None

    def move_main(self, run: procedures.Run, to: str, cause: str, checkpoint: dict) -> None:
        with self._lock:
            dev = self._own(run)
            if dev:
                self._move_main(dev, to, cause, checkpoint)

    def _move_main(self, dev: Device, to: str, cause: str, checkpoint: dict) -> None:
        if dev.states.main != to:
            self._transition(dev, [dev.states.move("main", to, cause, checkpoint)])

    def join_pool(self, run: procedures.Run, cause: str, checkpoint: dict) -> bool:
        self._redescribe(run.device)  # its driver is bound now: driver and class serial are readable
        with self._lock:
            dev = self._own(run)
            if dev is None or dev.states.health != "DISCOVERED":
                return False
            if not checkpoint["ok"]:
                self._move_health(dev, "FAULTED", f"{cause}:checkpoint", checkpoint)
                return False
            dev.busy = None  # HEALTHY must mean allocatable at once
            self._move_health(dev, "HEALTHY", cause, checkpoint)
            if dev.pending_health:
                self._apply_health(dev, dev.pending_health, "aer:during_self_check", checkpoint)
                dev.pending_health = None
            return dev.states.health == "HEALTHY"

    def fault(self, run: procedures.Run, cause: str, checkpoint: dict) -> None:
        with self._lock:
            dev = self._own(run)
            if dev:
                self._apply_health(dev, "FAULTED", cause, checkpoint)

    def restore_health(self, run: procedures.Run, cause: str, checkpoint: dict) -> bool:
        with self._lock:
            dev = self._own(run)
            if dev is None or dev.states.health not in ("DEGRADED", "FAULTED"):
                return False
            self._move_health(dev, "HEALTHY", cause, checkpoint)
            dev.aer.clear()
            return True

    def inconclusive(self, run: procedures.Run, exc: OwnResourcesShort) -> None:
        """A procedure's check could not run: log it; a hot-add is tried again on the next poll."""
        self.own_errors.inconclusive(exc, f"{run.device} {run.run_id}")
        if run.procedure == "hot_add":
            with self._lock:
                dev = self._own(run)
                if dev is not None and dev.states.health == "DISCOVERED":
                    dev.hot_add_entry = run.entry

    def isolate(self, run: procedures.Run, cause: str) -> None:
        with self._lock:
            dev = self._own(run)
            if dev:
                dev.isolated = True

    def deallocate(self, run: procedures.Run, reason: str) -> list[dict]:
        """DEALLOCATE to the holders (leases revoked), and to the orchestrator: the device-plugin
        front end has sent the device out of service before the procedure goes on to take it off
        the bus (bounded, front_end.REPORT_OUT_S)."""
        with self._lock:
            dev = self._own(run)
            notified = self._revoke(dev, reason) if dev else []
        if dev is not None and self.front_end is not None:
            if not self.front_end.report_out_of_service(dev.bdf):
                _log.warning("%s: the device plugin's streams were not sent %s's loss in time",
                             run.run_id, dev.bdf)
        return notified

    def topology_leave(self, run: procedures.Run, cause: str) -> dict:
        with self._lock:
            dev = self._own(run)
            if dev is None:
                return {"generation": self.generation, "note": "device already gone"}
            dev.leaving = True
            return self._topology(cause, left=run.device)

    def finish_removal(self, run: procedures.Run, cause: str) -> None:
        with self._lock:
            dev = self._own(run)
            if dev is not None:
                self._remove_record(dev, cause)

    def _remove_record(self, dev: Device, cause: str) -> None:
        """The record leaves the table (lock held): leases revoked, REMOVED, topology without it."""
        bdf = dev.bdf
        del self.devices[bdf]
        dev.gone = True
        self._revoke(dev, cause, to_released=False)  # ALLOCATED -> REMOVED: it is gone
        self._move_health(dev, "REMOVED", cause, {"name": "removal", "ok": True})
        self.emit("removed", {"device": bdf, "cause": cause, "fingerprint": dev.info.fingerprint})
        if not dev.leaving:
            self._topology(cause, left=bdf)
        # The slot keeps the identity of what left it, however it left (orderly or not):
        # another unit there later is flagged (DISC-05), the same unit back is not.
        for src in (bdf,) + ((dev.port,) if dev.port and dev.port not in self._known_sources() else ()):
            self._counter.forget(src)
            self._aer_applied[src] = next(self._aer_reads)  # a read begun before the removal is stale

    def record_reset(self, run: procedures.Run, outcome: dict) -> None:
        with self._lock:
            dev = self._own(run)
            if dev:
                dev.aer.note_reset(time.monotonic_ns())
            self.emit("reset", {"device": run.device, **outcome})
