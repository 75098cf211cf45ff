"""Device arrival and departure: the discovery watcher's callbacks, hot-add and self-check start.

Why its own module: a change from udev or the kernel's uevents (add, remove, bind, an AER
outcome) is handled at once on the watcher's thread (DISC-02/06 latency); a new record is
``discovered`` before its baselines, identity check and self-check run on a procedure
thread. Hot-adds that could not be described for want of the runtime's own resources wait
in ``_pending_adds`` for the next poll.
"""

from __future__ import annotations

import time

from . import procedures
from .aer import DeviceAer, totals
from .device_classes import ClassHooks, hooks_for
from .device_table import Device, log
from .discovery import PciChange
from .inventory import DeviceGone, DeviceInfo, IdentityRegistry, describe
from .own_resources import OwnResourcesShort

SELF_CHECK_DEFER_S = 2.0  # a hot-add self-check waits at most this long for a storm's other adds to be read


class DeviceArrival:
    """What the service does when devices come, go or change (discovery's callbacks)."""

    def _on_change(self, change: PciChange) -> None:
        """Called at once for each change (DISC-02/06 latency), before the batch closes."""
        props = change.properties
        if change.action == "add":
            t0 = time.monotonic_ns()
            try:
                info = describe(self.sysfs, change.bdf)
            except DeviceGone:
                return
            except OwnResourcesShort as exc:  # described again on the next poll
                self.own_errors.inconclusive(exc, f"{change.bdf} hot-add")
                with self._lock:
                    self._pending_adds[change.bdf] = change
                return
            timing = {
                "queued_ms": (t0 - change.received_ns) / 1e6,
                "describe_ms": (time.monotonic_ns() - t0) / 1e6,
            }
            self._add_device(info, "hot_add", change, timing)
        elif change.action == "remove" and not props.get("CHILD_SUBSYSTEM"):
            with self._lock:
                self._pending_adds.pop(change.bdf, None)
            self._vanished(change.bdf, "surprise")
        elif props.get("ERROR_EVENT"):
            self._aer_uevent(change)
        elif change.action in ("bind", "unbind", "change"):
            self._redescribe(change.bdf)

    def _on_batch(self, batch: list[PciChange]) -> None:
        """One topology rebuild per batch (DISC-04)."""
        actions: dict[str, int] = {}
        for change in batch:
            actions[change.action] = actions.get(change.action, 0) + 1
        with self._lock:
            self._topology("udev_batch", changes=len(batch), actions=actions)

    def _vanished(self, bdf: str, cause: str) -> None:
        with self._lock:
            dev = self.devices.get(bdf)
            if dev is None:
                return
            self._remove_record(dev, "hot_remove" if dev.leaving else cause)

    def _redescribe(self, bdf: str) -> None:
        with self._lock:
            dev = self.devices.get(bdf)
            # config reads block during a reset and during the kernel's error recovery (its link
            # reset); a read stuck there would hold the device's outcome uevent behind it
            if dev is None or dev.gone or dev.resetting or dev.aer.recovering_since_ns is not None:
                return
            previous = dev.info
        try:
            info = describe(self.sysfs, bdf, previous)
        except DeviceGone:
            return
        except OwnResourcesShort as exc:  # the record stays as it was
            self.own_errors.inconclusive(exc, f"{bdf} re-describe")
            return
        with self._lock:
            if self.devices.get(bdf) is dev:
                info.fingerprint = info.fingerprint or previous.fingerprint
                dev.info = info
                if self.identities.observe(info):
                    dev.identity_changed = True
                    self.emit(
                        "identity_changed",
                        {
                            "device": bdf,
                            "location": IdentityRegistry.location(info),
                            "fingerprint": info.fingerprint,
                        },
                    )

    def _add_device(
        self, info: DeviceInfo, cause: str, change: PciChange | None, timing: dict | None = None
    ) -> None:
        """New record, ``discovered`` at once (DISC-02 latency); baselines, identity check and the
        self-check follow on the self-check's thread."""
        try:
            hooks = hooks_for(info, self.cfg.hooks)
        except ValueError as exc:
            log(f"{info.bdf}: hooks config: {exc}; generic hooks used")
            hooks = ClassHooks()
        port = self.sysfs.parent_bdf(info.bdf)
        with self._lock:
            old = self.devices.get(info.bdf)
            if old is not None and not old.gone:
                return  # already known (an add racing the boot enumeration)
            known = self._known_sources()
            dev = Device(info, hooks, self.table, DeviceAer(self.policy), port)
            dev.busy = "hot_add"  # not allocatable, not polled, until the self-check ends
            self.devices[info.bdf] = dev
            self.emit(
                "discovered",
                {
                    "device": info.bdf,
                    "cause": cause,
                    "state": dev.states.health,
                    "main_state": dev.states.main,
                    "fingerprint": info.fingerprint,
                    "info": info.to_dict(),
                    "udev_received_ns": change.received_ns if change else None,
                    **({"timing_ms": {k: round(v, 3) for k, v in timing.items()}} if timing else {}),
                },
            )
            self._start_hot_add(dev, cause, first_seen=known)

    def _first_seen(self, dev: Device, known: set[str]) -> bool:
        """AER baselines and the identity check of a new record, on its self-check's thread (off
        the discovery path); False when the device is gone meanwhile."""
        info = dev.info
        baselines = {}
        for src in filter(None, (info.bdf, dev.port)):
            try:
                baselines[src] = totals(self.sysfs.aer_counters(src))
            except OwnResourcesShort as exc:  # no baseline: the first poll that can read sets it
                self.own_errors.inconclusive(exc, f"{info.bdf} AER baseline")
        with self._lock:
            if self.devices.get(info.bdf) is not dev or dev.gone:
                return False
            for src, current in baselines.items():
                if src == info.bdf or src not in known:  # a port shared with a sibling keeps its baseline
                    self._counter.baseline(src, current)
                    self._aer_applied[src] = next(self._aer_reads)  # reads begun before it are stale
            if self.identities.observe(info):
                dev.identity_changed = True
                self.emit(
                    "identity_changed",
                    {
                        "device": info.bdf,
                        "location": IdentityRegistry.location(info),
                        "fingerprint": info.fingerprint,
                    },
                )
            return True

    def _start_hot_add(self, dev: Device, entry: str, first_seen: set[str] | None = None) -> None:
        """The self-check on its own thread (lock held). ``first_seen``: the known AER sources
        before this new record, whose baselines and identity check run first."""
        dev.hot_add_entry = None
        info, hooks = dev.info, dev.hooks

        def after_the_storm(run):
            self.watcher.wait_adds_handled(SELF_CHECK_DEFER_S)
            if first_seen is not None and not self._first_seen(dev, first_seen):
                return None
            return procedures.hot_add(self, run, info, hooks)

        self._start(dev, "hot_add", entry, after_the_storm)

    def _retry_pending_adds(self) -> None:
        """Hot-adds whose description or self-check could not run for want of resources."""
        with self._lock:
            pending, self._pending_adds = self._pending_adds, {}
            for dev in self.devices.values():
                if dev.hot_add_entry and not dev.busy and not dev.gone and dev.states.health == "DISCOVERED":
                    self._start_hot_add(dev, dev.hot_add_entry)
        for change in pending.values():
            self._on_change(change)
