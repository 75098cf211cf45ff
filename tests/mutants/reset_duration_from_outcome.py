"""Mutant reset_duration_from_outcome, breaks AER-02: the kernel's link reset is recorded with the
duration of the runtime's own work after the recovery's outcome, not the kernel's recovery.

Plausible bug: the runtime times the "reset" from the outcome uevent to the end of its own
post-recovery checkpoint, so the recorded reset understates the kernel's recovery many times.
(Its predecessor, reset_duration_from_udev, timed from BEGIN_RECOVERY; that uevent now comes
in time and its duration was right.)
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    aer_uevent, emit = service.Service._aer_uevent, service.Service.emit
    outcome_at: dict[str, int] = {}

    def remember_outcome(self, change):
        if change.properties.get("ERROR_EVENT") in ("SUCCESSFUL_RECOVERY", "FAILED_RECOVERY"):
            outcome_at[change.bdf] = time.monotonic_ns()
        aer_uevent(self, change)

    def emit_from_outcome(self, name, data, ts_ns=None):
        if name == "reset" and data.get("source") == "kernel_aer" and data.get("device") in outcome_at:
            data = {**data, "duration_ms": round((time.monotonic_ns() - outcome_at[data["device"]]) / 1e6, 3)}
        return emit(self, name, data, ts_ns)

    service.Service._aer_uevent = remember_outcome
    service.Service.emit = emit_from_outcome


if __name__ == "__main__":
    launch("reset_duration_from_outcome", apply)
