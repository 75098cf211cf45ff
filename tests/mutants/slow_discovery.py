"""Mutant slow_discovery, breaks DISC-02: every hot-add is announced 1 s late.

Plausible bug: the runtime waits for udev to "settle" (a fixed 1 s pause, or a
`udevadm settle` call) before it describes a new device and emits `discovered`.
(It paused 500 ms until the reference read the kernel's own uevents: the reference's
p95 fell to 190-300 ms and 500 ms more fitted the 750 ms budget.)
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch

EXTRA_DELAY_S = 1.0


def apply() -> None:
    original = service.Service._on_change

    def on_change_after_a_pause(self, change) -> None:
        if change.action == "add":
            time.sleep(EXTRA_DELAY_S)
        original(self, change)

    service.Service._on_change = on_change_after_a_pause


if __name__ == "__main__":
    launch("slow_discovery", apply)
