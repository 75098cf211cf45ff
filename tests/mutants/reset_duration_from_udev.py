"""Mutant reset_duration_from_udev, breaks AER-02: the kernel's link reset is recorded with the
duration from udev's BEGIN_RECOVERY to the end, not from the error.

Plausible bug (the reference runtime had it): the uevent that says a recovery began comes only
once the kernel has reset the link, so the recorded reset understates the kernel's recovery
8-10 times.
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    aer_uevent, emit = service.Service._aer_uevent, service.Service.emit
    begun: dict[str, int] = {}

    def remember_begin(self, change):
        if change.properties.get("ERROR_EVENT") == "BEGIN_RECOVERY":
            begun[change.bdf] = change.received_ns
        aer_uevent(self, change)

    def emit_from_begin(self, name, data, ts_ns=None):
        if name == "reset" and data.get("source") == "kernel_aer" and data.get("device") in begun:
            data = {**data, "duration_ms": round((time.monotonic_ns() - begun[data["device"]]) / 1e6, 3)}
        return emit(self, name, data, ts_ns)

    service.Service._aer_uevent = remember_begin
    service.Service.emit = emit_from_begin


if __name__ == "__main__":
    launch("reset_duration_from_udev", apply)
