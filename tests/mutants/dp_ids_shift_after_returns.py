"""Mutant dp_ids_shift_after_returns, breaks DP-02: some seconds after devices come back, IDs stand
for other devices.

Plausible bug: the plugin keeps its ID -> device table as a list it rebuilds in the background
once RETURNS devices have come back (a "dirty" count), REBUILD_S after the last of them; the
rebuild orders the devices by arrival but keeps the IDs in their old order, so each ID now stands
for the next device. Every message still lists the same IDs Healthy; Allocate hands out the wrong
card (its device nodes and PCI address are another device's).

DP-04 ties the IDs back right after each return, before the rebuild: it passes. Only the
plugin's whole-life watch (fixtures/plugin_life_watch.py), which asks Allocate again at the end of
the plugin's life for IDs tied in their current Healthy run, after reading on a while after the
last change, sees an ID tied to another device without a break.
"""

from __future__ import annotations

import threading
import time

from hilconform.runtime.deviceplugin import front_end

from .launch import launch

RETURNS = 2  # re-arrivals before the table is rebuilt
REBUILD_S = 4.0  # after the last of them


def apply() -> None:
    original_snapshot = front_end.DevicePluginFrontEnd.snapshot
    original_bdf_of = front_end.DevicePluginFrontEnd.bdf_of
    lock = threading.Lock()
    state = {"ever": set(), "healthy": set(), "returns": 0, "at": None}

    def counting(self, endpoint):
        current = original_snapshot(self, endpoint)
        healthy = {d.ID for d in current if d.health == front_end.HEALTHY}
        with lock:
            back = (healthy - state["healthy"]) & state["ever"]  # Healthy again after a loss
            if back:
                state["returns"] += len(back)
                state["at"] = time.monotonic()
            state["ever"] |= healthy
            state["healthy"] = healthy
        return current

    def shifted(self, device_id):
        with lock:
            rebuilt = (state["returns"] >= RETURNS and state["at"] is not None
                       and time.monotonic() - state["at"] >= REBUILD_S)
            order = sorted(state["healthy"])
        if not rebuilt or device_id not in order or len(order) < 2:
            return original_bdf_of(self, device_id)
        return original_bdf_of(self, order[(order.index(device_id) + 1) % len(order)])

    front_end.DevicePluginFrontEnd.snapshot = counting
    front_end.DevicePluginFrontEnd.bdf_of = shifted


if __name__ == "__main__":
    launch("dp_ids_shift_after_returns", apply)
