"""Mutant device_fatal_uncounted, breaks AER-02: a fatal error a device reports itself is not
counted as fatal.

Plausible bug: the runtime counts errors from the aer_dev_* counters alone and takes a recovery
no counter showed for a non-fatal one. For a fatal error reported by an endpoint (every real GPU
has its own AER capability), the kernel does not read the endpoint's AER registers ("type=
Inaccessible"), so no counter grows; only the kernel's "Uncorrected (Fatal) error message
received from <device>" line says what happened.

Seen only where errors are raised at the device itself: a real host's aer_inject at a device
with AER (tests/integration/test_real_host_device_errors.py, the a100 models' stand-in). The
emulated hosts raise errors at the port above a device (QMP), which the port's counters show,
so it is not in the catalogue (tests/mutants/mutants.toml).
"""

from __future__ import annotations

from hilconform.runtime import aer

from .launch import launch


def apply() -> None:
    original = aer.DeviceAer.begin_recovery

    def begin_without_the_line_severity(self, now_ns: int, severity: str | None = None) -> None:
        original(self, now_ns, None)

    aer.DeviceAer.begin_recovery = begin_without_the_line_severity
    aer.DeviceAer.learn_severity = lambda self, severity: None


if __name__ == "__main__":
    launch("device_fatal_uncounted", apply)
