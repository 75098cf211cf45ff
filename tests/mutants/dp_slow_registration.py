"""Mutant dp_slow_registration, breaks DP-01: the plugin registers 30 s after it started.

Plausible bug: the plugin waits for a fixed "settle" time (or for a health scan of every device
with long timeouts) before it registers; the node's devices are missing from the scheduler for
that long after every plugin restart.
"""

from __future__ import annotations

import time

from hilconform.runtime.deviceplugin import front_end

from .launch import launch

SETTLE_S = 30.0


def apply() -> None:
    original = front_end.DevicePluginFrontEnd._register_loop

    def register_after_a_pause(self) -> None:
        time.sleep(SETTLE_S)
        original(self)

    front_end.DevicePluginFrontEnd._register_loop = register_after_a_pause


if __name__ == "__main__":
    launch("dp_slow_registration", apply)
