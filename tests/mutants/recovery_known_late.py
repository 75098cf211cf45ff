"""Mutant recovery_known_late, breaks LIFE-03: a device's error recovery counts as under way only
from udev's BEGIN_RECOVERY, which the kernel sends when it is already done resetting the link.

Plausible bug (the reference runtime had it): the recovery window is opened by the uevent alone,
although the kernel logged the error at once, so allocations inside the kernel's recovery are
granted and revoked moments later.
"""

from __future__ import annotations

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    begin_recovery = service.Service._begin_recovery

    def begin_only_on_udev(self, dev, now_ns, source, **detail):
        if source == "kernel_log":
            return  # the error line is seen (and counted) but does not open the window
        begin_recovery(self, dev, now_ns, source, **detail)

    service.Service._begin_recovery = begin_only_on_udev


if __name__ == "__main__":
    launch("recovery_known_late", apply)
