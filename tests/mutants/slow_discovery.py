"""Mutant slow_discovery, breaks DISC-02: every hot-add is announced 500 ms late.

Plausible bug: the runtime waits for udev to "settle" (a fixed 500 ms pause, or a
`udevadm settle` call) before it describes a new device and emits `discovered`.
"""

from __future__ import annotations

import time

from hilconform.runtime import service

from .launch import launch

EXTRA_DELAY_S = 0.5


def apply() -> None:
    original = service.Service._on_change

    def on_change_after_a_pause(self, change) -> None:
        if change.action == "add":
            time.sleep(EXTRA_DELAY_S)
        original(self, change)

    service.Service._on_change = on_change_after_a_pause


if __name__ == "__main__":
    launch("slow_discovery", apply)
