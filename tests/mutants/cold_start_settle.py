"""Mutant cold_start_settle, breaks DISC-03: the boot enumeration starts 3 s after the runtime.

Plausible bug: the runtime waits for udev to "settle" at start (a fixed pause, or a
`udevadm settle` with a long timeout) before it enumerates the devices present, so every
cold start is late by that pause.
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch

SETTLE_S = 3.0


def apply() -> None:
    original = service.Service.start

    def start_after_a_pause(self, serve: bool = True) -> None:
        time.sleep(SETTLE_S)
        original(self, serve)

    service.Service.start = start_after_a_pause


if __name__ == "__main__":
    launch("cold_start_settle", apply)
