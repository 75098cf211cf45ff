"""Destructive sysfs paths on a real host (only with --allow-destructive, only on safe devices).

Latencies are measured on the real host's own CLOCK_MONOTONIC: from the moment the sysfs
write begins (a python3 one-liner on the host prints it) to the runtime's event `ts_ns`
(the same clock), so the SSH link's delay is not counted.

* DISC-06: `echo 1 > /sys/bus/pci/devices/BDF/remove` -> the runtime's `removed` event
  within `removal_detect_ms`; the device leaves the inventory.
* DISC-02: `echo 1 > /sys/bus/pci/rescan` after such a removal -> the runtime's
  `discovered` event within `hot_add_discovery_p95_ms` (one sample per test: a rescan
  brings back only what was removed), its self-check ends HEALTHY, its driver is bound.
* RST-01: protocol `reset` of an idle HEALTHY device completes within `reset_budget_ms`
  and leaves it HEALTHY and allocatable.

Every action goes through the real host's journal (a runtime remove/reset too); the
`real_host` fixture puts every device back at the end of the session (rescan, re-bind)
even when a test failed.
"""

from __future__ import annotations

import time

import pytest
from real_support import (
    RUNTIME_EVENT_TIMEOUT_S,
    destructive_target,
    runtime_record,
    wait_self_check_end,
)

pytestmark = pytest.mark.destructive
RESETS = 3


def _remove(host, bdf: str) -> float:
    """sysfs-remove `bdf`; ms (host clock) from the write to the runtime's `removed` event."""
    runtime = host.runtime
    mark = runtime.mark()
    runtime.call("subscribe", {})
    started_ns = host.sysfs_remove(bdf)
    removed = runtime.wait_event("removed", mark, RUNTIME_EVENT_TIMEOUT_S,
                                 match=lambda d: d["device"] == bdf, what=f"removed {bdf}")
    return (removed["ts_ns"] - started_ns) / 1e6


def _rescan(host, bdf: str) -> float:
    """Rescan; ms (host clock) from the write to the runtime's `discovered` for `bdf`."""
    runtime = host.runtime
    mark = runtime.mark()
    started_ns = host.sysfs_rescan()
    found = runtime.wait_event("discovered", mark, RUNTIME_EVENT_TIMEOUT_S,
                               match=lambda d: d["device"] == bdf, what=f"discovered {bdf} after a rescan")
    wait_self_check_end(runtime, bdf, mark)
    return (found["ts_ns"] - started_ns) / 1e6


@pytest.mark.clause("DISC-06")
@pytest.mark.needs("real-host", "surprise-removal", "hot-add")
def test_sysfs_removal_is_detected_within_budget(host, measurements):
    bdf = destructive_target(host)
    removal_ms = _remove(host, bdf)
    assert bdf not in {d["device"] for d in host.runtime.call("inventory")["devices"]}
    _rescan(host, bdf)  # put it back for the next test (the session end would too)
    summary = measurements.record("DISC-06", "sysfs_removal_detect", [removal_ms], "ms",
                                  budget=host.profile.budgets["removal_detect_ms"], budget_stat="max")
    assert summary.within_budget, summary.text()


@pytest.mark.clause("DISC-02")
@pytest.mark.needs("real-host", "surprise-removal", "hot-add")
def test_sysfs_rescan_discovery_within_budget(host, measurements):
    bdf = destructive_target(host)
    driver = host.managed_truth()[bdf]["driver"]
    _remove(host, bdf)
    discovery_ms = _rescan(host, bdf)
    assert runtime_record(host.runtime, bdf)["state"] == "HEALTHY"
    assert host.managed_truth()[bdf]["driver"] == driver, f"{bdf} came back without its driver {driver}"
    summary = measurements.record("DISC-02", "sysfs_rescan_discovery", [discovery_ms], "ms",
                                  budget=host.profile.budgets["hot_add_discovery_p95_ms"], budget_stat="max")
    assert summary.within_budget, summary.text()


@pytest.mark.clause("RST-01")
@pytest.mark.needs("real-host", "reset")
def test_requested_reset_of_a_healthy_device_within_budget(host, measurements):
    bdf = destructive_target(host)
    runtime = host.runtime
    budget_ms = host.profile.budgets["reset_budget_ms"]
    assert runtime_record(runtime, bdf)["state"] == "HEALTHY"
    round_trips = []
    for i in range(RESETS):
        t0 = time.monotonic_ns()
        result = runtime.call("reset", {"device": bdf}, timeout_s=3 * budget_ms / 1e3 + 10)
        round_trips.append((time.monotonic_ns() - t0) / 1e6)
        assert result["outcome"] == "ok", f"reset {i + 1} of {bdf} failed: {result}"
        record = runtime_record(runtime, bdf)
        assert record["state"] == "HEALTHY" and record["in_pool"], f"after reset {i + 1}: {record}"
    summary = measurements.record("RST-01", "real_requested_reset_round_trip", round_trips, "ms",
                                  budget=budget_ms, budget_stat="max")
    assert summary.within_budget, summary.text()
