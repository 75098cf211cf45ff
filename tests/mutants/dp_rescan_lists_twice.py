"""Mutant dp_rescan_lists_twice, breaks DP-02: some seconds after a device arrives, one ID is listed twice.

Plausible bug: besides reacting to events, the plugin rescans its devices once hot-plug activity
has settled (QUIET_S after the latest arrival since its start's enumeration) and merges what it
found into its list by appending instead of replacing: a device that arrived (hot-added, or back
after a loss) since the last rescan is listed twice, one ID in two entries, in every message from
then on. The kubelet's capacity and checkpoint now disagree with the plugin's set (the API
requires distinct IDs).

Every test judges the message that shows the arrival, which comes before the rescan, and reads
a message's devices by ID (a duplicate collapses): the test that added the device passes. Only
the whole-life watch (fixtures/plugin_life_watch.py), which judges every message of the plugin's
life and reads on a while after a recent change, sees it: after the test's checks have ended.
"""

from __future__ import annotations

import threading
import time

from hilconform.runtime.deviceplugin import front_end

from .launch import launch

QUIET_S = 4.5  # how long after the latest arrival the rescan merges
START_S = 2.0  # the start's enumeration is over once the set stayed the same this long


def apply() -> None:
    original = front_end.DevicePluginFrontEnd.snapshot
    lock = threading.Lock()
    seen: dict[str, dict] = {}  # endpoint resource -> its state

    def rescanned(self, endpoint):
        current = original(self, endpoint)
        now = time.monotonic()
        healthy = {d.ID for d in current if d.health == front_end.HEALTHY}
        with lock:
            state = seen.setdefault(endpoint.resource, {"healthy": set(), "changed": now, "settled": False,
                                                        "arrived": set(), "at": None})
            if healthy != state["healthy"]:
                if state["settled"] and healthy - state["healthy"]:  # a device arrived after the start
                    state["arrived"] |= healthy - state["healthy"]
                    state["at"] = now
                state["healthy"], state["changed"] = healthy, now
            # only arrivals after the start's enumeration are rescanned
            state["settled"] = state["settled"] or now - state["changed"] >= START_S
            state["arrived"] &= healthy
            if state["at"] is None or now - state["at"] < QUIET_S or not state["arrived"]:
                return current
            again = tuple(d for d in current if d.ID in state["arrived"])  # appended, not replaced
        return current + again

    front_end.DevicePluginFrontEnd.snapshot = rescanned


if __name__ == "__main__":
    launch("dp_rescan_lists_twice", apply)
