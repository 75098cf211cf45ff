"""The service's reaction to the kernel log: attention buttons and the first sign of an AER error.

Why its own module: the kernel's log lines (kernel_log.py parses them) name a slot, a port
or an error source, not always the device; here a line is matched to the devices it
concerns, an attention button starts an orderly removal, and an uncorrected error opens
the device's recovery window before udev's uevents say anything.
"""

from __future__ import annotations

import time

from .device_table import Device
from .kernel_log import KernelEvent


class KernelLogReaction:
    """``on_kernel_event``: the kernel log follower's callback."""

    def on_kernel_event(self, ev: KernelEvent) -> None:
        with self._lock:
            self.emit("kernel", ev.to_dict())
            targets = [d for d in self.devices.values() if not d.gone and _kernel_event_concerns(ev, d)]
            if ev.kind == "button_power_off":
                for dev in targets:
                    if dev.busy == "hot_remove" or dev.leaving:
                        continue
                    if dev.busy:
                        dev.pending_removal = "attention_button"
                    else:
                        self._start_removal(dev, "attention_button")
        if ev.kind == "aer_error" and targets:
            if ev.severity in ("nonfatal", "fatal"):
                with self._lock:
                    for dev in targets:
                        if not dev.gone:
                            self._begin_recovery(
                                dev, ev.received_ns or time.monotonic_ns(), "kernel_log", severity=ev.severity
                            )
            self._poll_aer([d.bdf for d in targets])


def _kernel_event_concerns(ev: KernelEvent, dev: Device) -> bool:
    """pciehp lines name the slot (and its port); AER lines the error source (device or port)."""
    if ev.slot is not None:
        return dev.info.slot == ev.slot and ev.port in (None, dev.port)
    if ev.bdf is not None:
        return ev.bdf in (dev.bdf, dev.port)
    return ev.port is not None and ev.port in (dev.bdf, dev.port)
