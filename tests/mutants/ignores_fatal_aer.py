"""Mutant ignores_fatal_aer, breaks AER-02: fatal errors are not counted.

Plausible bug: the runtime reads only the non-fatal AER counters, so a fatal error and
the link reset the kernel does to recover from it go unrecorded and the device keeps
the state a non-fatal error would give it.
"""

from __future__ import annotations

from hilconform.runtime import aer

from .launch import launch


def apply() -> None:
    original = aer.DeviceAer.record

    def record_without_fatal(self, severity: str, count: int, now_ns: int) -> None:
        if severity != "fatal":
            original(self, severity, count, now_ns)

    aer.DeviceAer.record = record_without_fatal


if __name__ == "__main__":
    launch("ignores_fatal_aer", apply)
