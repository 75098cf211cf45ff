"""The health watch: AER counters, the kernel's recovery windows, and the verdict they lead to.

Why its own module: error signals reach the runtime three ways (the aer_dev_* counters,
the kernel log's error lines, udev's recovery uevents) and at different times. Here they
are read, a recovery window is opened by the first sign and closed by the kernel's outcome
(or by the health poll after a grace), and ``_judge`` combines the AER verdict with a
config checkpoint into one health state (LIFE-03, LIFE-05, AER-01..02, RST-03).
"""

from __future__ import annotations

import time
from typing import Any

from . import procedures
from .aer import SEVERITIES, totals
from .device_table import Device
from .discovery import PciChange
from .own_resources import OwnResourcesShort

RECOVERY_GRACE_NS = 10_000_000_000  # config may read all ones while the kernel recovers the link
# The kernel's uevents can outrun its log (read by another thread): an error line read this soon
# after its episode's window closed belongs to that episode and opens no new window.
LATE_ERROR_LINE_NS = 2_000_000_000


class HealthWatch:
    """AER polling, recovery windows and judging, and the periodic health poll."""

    def _poll_aer(self, bdfs: list[str] | None = None) -> int:
        """Read aer_dev_* of the devices and their ports; port errors count on the devices below.

        Returns how many sources could not be read for want of the runtime's own resources.
        """
        with self._lock:
            devs = [d for d in self.devices.values() if not d.gone and (bdfs is None or d.bdf in bdfs)]
            sources = {d.bdf for d in devs} | {d.port for d in devs if d.port}
            number = next(self._aer_reads)
        # Read outside the service lock: a dozen sysfs reads on a TCG guest's one CPU held it for
        # 200-490 ms every health poll, and a hot-add's `discovered` waited behind them (DISC-02 on
        # a100-stock, 2026-12-06). Several threads poll (kernel log, udev, health poll); a stale
        # read applied after a fresh one would look like a counter reset and count every error
        # again, so a read older than the latest one applied for its source is dropped (the
        # counters are totals: the newer read already holds its counts). The aer_dev_* files are
        # kernel memory, not config space, so reading them cannot block.
        reads, unread = {}, 0
        for src in sorted(sources):
            try:
                reads[src] = self.sysfs.aer_counters(src)
            except OwnResourcesShort as exc:  # not read: no delta now, the next read has it all
                self.own_errors.inconclusive(exc, f"{src} AER counters")
                unread += 1
        with self._lock:
            now = time.monotonic_ns()
            for src, counters in reads.items():
                if not counters or self._aer_applied.get(src, 0) > number:
                    continue
                self._aer_applied[src] = number
                delta = self._counter.delta(src, totals(counters))
                if not any(delta.values()):
                    continue
                targets = [d for d in self.devices.values() if not d.gone and (d.bdf == src or d.port == src)]
                for dev in targets:
                    for sev, n in delta.items():
                        dev.aer.record(sev, n, now)
                    self.emit(
                        "aer",
                        {
                            "device": dev.bdf,
                            "kind": "counted",
                            "source": src,
                            "delta": delta,
                            **dev.aer.to_dict(now),
                        },
                    )
        return unread

    def _aer_uevent(self, change: PciChange) -> None:
        """udev's view of the kernel's recovery: BEGIN_RECOVERY, then SUCCESSFUL_ or FAILED_RECOVERY."""
        event = change.properties.get("ERROR_EVENT", "")
        online = change.properties.get("DEVICE_ONLINE")
        if event not in ("BEGIN_RECOVERY", "SUCCESSFUL_RECOVERY", "FAILED_RECOVERY"):
            self._poll_aer([change.bdf])
            return
        with self._lock:
            dev = self.devices.get(change.bdf)
            if dev is None or dev.gone:
                return
            # BEGIN_RECOVERY opens the window unless the kernel's error line did; an outcome with no
            # window open (no kernel log, no BEGIN_RECOVERY: a driverless device's recovery fails at
            # once) is an episode of its own
            self._begin_recovery(
                dev,
                change.received_ns,
                "udev",
                **({"online": online == "1"} if event == "BEGIN_RECOVERY" else {}),
            )
        if event == "BEGIN_RECOVERY":
            self._poll_aer([change.bdf])
            return
        self._end_recovery(change.bdf, event == "SUCCESSFUL_RECOVERY", "udev", online=online == "1")

    def _begin_recovery(self, dev: Device, now_ns: int, source: str, **detail: Any) -> None:
        """Open the device's recovery window (lock held): from now until the kernel says how the
        recovery ended, the device is not HEALTHY for allocation (LIFE-03). The first signal wins:
        the kernel log's error line comes before udev's BEGIN_RECOVERY, which the kernel sends
        only once it is done resetting."""
        severity = detail.get("severity") if source == "kernel_log" else None
        if dev.aer.recovering_since_ns is not None:
            if severity is not None:
                dev.aer.learn_severity(severity)
            return
        if source == "kernel_log" and now_ns - dev.recovery_ended_ns < LATE_ERROR_LINE_NS:
            return  # the kernel's line of an episode its uevents already opened and closed
        dev.aer.begin_recovery(now_ns, severity)
        self.emit("aer", {"device": dev.bdf, "kind": "begin_recovery", "source": source, **detail})

    def _end_recovery(self, bdf: str, successful: bool, source: str, online: bool | None = None) -> None:
        """Close the device's recovery window (udev's outcome, or the health poll when none came):
        record the outcome, the kernel's link reset and its duration, and judge the device. The
        kernel log's own "device recovery ..." line is not used: udev broadcasts the outcome later,
        and a window closed early would take that late outcome for another error's."""
        self._poll_aer([bdf])
        with self._lock:
            dev = self.devices.get(bdf)
            if dev is None or dev.gone or dev.aer.recovering_since_ns is None:
                return  # no window open: the other source closed it already
            resetting = dev.resetting
        checkpoint = None
        if successful and not resetting:
            try:
                checkpoint = procedures.config_intact(self.sysfs, bdf, dev.info)
            except OwnResourcesShort as exc:  # judged on AER alone; the next poll checks config
                self.own_errors.inconclusive(exc, f"{bdf} AER recovery checkpoint")
        now = time.monotonic_ns()
        with self._lock:
            if self.devices.get(bdf) is not dev or dev.gone or dev.aer.recovering_since_ns is None:
                return
            began = dev.aer.recovering_since_ns
            named = dev.aer.recovering_severity
            severity, uncounted = dev.aer.end_recovery(now)
            dev.recovery_ended_ns = now
            if uncounted is not None:  # no counter showed the episode's error: it counts once here
                self.emit("aer", {
                    "device": bdf,
                    "kind": "counted",
                    "source": "kernel_log" if named else "recovery",  # the line's severity, or assumed
                    "delta": {sev: int(sev == uncounted) for sev in SEVERITIES},
                    **dev.aer.to_dict(now),
                })
            detail = {"device": bdf, "severity": severity, "source": source, **dev.aer.to_dict(now)}
            if online is not None:
                detail["online"] = online
            if not successful:
                self.emit("aer", {**detail, "kind": "recovery_failed"})
                self._apply_health(
                    dev,
                    "FAULTED",
                    "aer:failed_recovery",
                    {"name": "aer_recovery", "ok": False, "source": source},
                )
                return
            self.emit("aer", {**detail, "kind": "recovered"})
            if severity == "fatal" and source != "health_poll":  # the kernel reset the link (AER-02)
                self.emit(
                    "reset",
                    {
                        "device": bdf,
                        "outcome": "ok",
                        "source": "kernel_aer",
                        "methods": ["link"],
                        # from the first sign of the error (the kernel's log line) to its recovery
                        "duration_ms": round((now - began) / 1e6, 3),
                    },
                )
            self._judge(dev, checkpoint, f"aer:recovered_{severity}", recovered=severity)

    def _judge(self, dev: Device, checkpoint: dict | None, cause: str, recovered: str | None = None) -> None:
        """Combine the AER verdict and the config checkpoint; the worse one wins (lock held)."""
        now = time.monotonic_ns()
        verdict = dev.aer.verdict(now, recovered)
        signals = [verdict.health]
        if checkpoint is not None and not checkpoint["ok"]:
            signals.append("FAULTED")
        target = self.table.worse(*signals)
        evidence = {
            "name": "health",
            "ok": target == "HEALTHY",
            "aer": {"weight": verdict.weight, "reasons": list(verdict.reasons)},
            "config": checkpoint,
        }
        why = cause if target == verdict.health or checkpoint is None or checkpoint["ok"] else "config_lost"
        self._apply_health(dev, target, why, evidence)
        if (
            verdict.reset
            and not dev.busy
            and not dev.gone
            and dev.states.health not in ("FAULTED", "REMOVED")
        ):
            dev.aer.note_reset(now)
            self._release_for(dev, "aer_reset")
            self._start(
                dev,
                "reset",
                "aer_sustained_rate",
                lambda run: procedures.reset_procedure(self, run, dev.info),
            )

    def health_poll(self, bdfs: list[str] | None, cause: str) -> dict:
        """Checkpoint every (or the given) idle device: presence, config, AER (RST-03, LIFE-05)."""
        with self._lock:
            devs = [d for d in self.devices.values() if (bdfs is None or d.bdf in bdfs)]
        inconclusive = self._poll_aer([d.bdf for d in devs])
        results = {}
        for dev in devs:
            recovering = dev.aer.recovering_since_ns
            if recovering is not None and time.monotonic_ns() - recovering < RECOVERY_GRACE_NS:
                results[dev.bdf] = {
                    "state": dev.states.health,
                    "skipped": "AER recovery in progress",
                }
                continue
            if recovering is not None:  # no word from the kernel in time: the checkpoint judges
                self._end_recovery(dev.bdf, True, "health_poll")
            if dev.gone or dev.busy or dev.resetting or dev.states.health in ("DISCOVERED", "REMOVED"):
                why = dev.busy or ("a reset is still running" if dev.resetting else "not checkable now")
                results[dev.bdf] = {"state": dev.states.health, "skipped": why}
                continue
            try:
                if not self.sysfs.exists(dev.bdf):
                    self._vanished(dev.bdf, "vanished")
                    results[dev.bdf] = {"state": "REMOVED", "cause": "vanished"}
                    continue
                checkpoint = procedures.config_intact(self.sysfs, dev.bdf, dev.info)
            except OwnResourcesShort as exc:  # says nothing about the device: it keeps its state
                self.own_errors.inconclusive(exc, f"{dev.bdf} health poll")
                inconclusive += 1
                results[dev.bdf] = {"state": dev.states.health, "skipped": f"inconclusive: {exc}"}
                continue
            with self._lock:
                if self.devices.get(dev.bdf) is dev and not dev.busy:
                    if dev.release_cause and dev.states.health == "RELEASED":
                        self._finish_release(dev, dev.release_cause, checkpoint)
                    else:
                        self._judge(dev, checkpoint, cause)
                results[dev.bdf] = {
                    "state": dev.states.health,
                    "checkpoint": checkpoint,
                    "aer": dev.aer.to_dict(time.monotonic_ns()),
                }
        if not inconclusive and devs:
            self.own_errors.conclusive()
        return results
