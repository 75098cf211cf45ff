"""Mutant heals_when_quiet, breaks LIFE-01: a DEGRADED device goes back to HEALTHY by itself,
QUIET_S after it was degraded, with no `recover` operation (cause `health:quiet`).

Plausible bug: a "self-healing" timer in a runtime's housekeeping thread ("no error for a while:
the device is fine again") that never asks whether the table lets anything but `recover` take
DEGRADED -> HEALTHY. It acts seconds after the test that degraded the device has ended its own
watch: a judge that looks only inside each test's window never sees it (issue 44, #1); the
whole-life watch does (fixtures/runtime_life_watch.py).
"""

from __future__ import annotations

import threading
import time

from hilconform.runtime import service
from hilconform.runtime.lifecycle import Transition

from .launch import launch

QUIET_S = 12.0  # longer than LIFE-05's own watch of a decayed DEGRADED device (about 10 s)
CAUSE = "health:quiet"


def apply() -> None:
    original_init = service.Service.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        since: dict[str, int] = {}  # device -> when it was first seen DEGRADED (monotonic ns)

        def housekeeping() -> None:
            while True:
                time.sleep(0.5)
                now = time.monotonic_ns()
                with self._lock:
                    for dev in list(self.devices.values()):
                        if dev.states.health != "DEGRADED" or dev.gone:
                            since.pop(dev.bdf, None)
                            continue
                        first = since.setdefault(dev.bdf, now)
                        if now - first < QUIET_S * 1e9:
                            continue
                        since.pop(dev.bdf, None)
                        move = Transition(dev.bdf, "health", "DEGRADED", "HEALTHY", CAUSE,
                                          {"name": "health", "ok": True}, now)
                        dev.states.health = "HEALTHY"  # the bug: no recover, no table check
                        self._transition(dev, [move])

        threading.Thread(target=housekeeping, name="self-heal", daemon=True).start()

    service.Service.__init__ = init


if __name__ == "__main__":
    launch("heals_when_quiet", apply)
