"""RST-01: a requested reset of a HEALTHY device completes within budget and it stays HEALTHY.

Protocol `reset` of an idle HEALTHY device, several times. Measured on the host:
request sent -> reply received (the runtime answers when its reset procedure,
including the post-reset checkpoint, has ended); the runtime's own
`duration_ms` is recorded beside it. Budget: the profile's `reset_budget_ms`,
applied to the slowest reset (every reset must meet it). The device is left
as found (HEALTHY, free), so the shared VM is used.
"""

from __future__ import annotations

import time

import pytest
from reset_support import CALL_TIMEOUT_S, health_transitions, healthy_device, subscribe

RESETS = 5


@pytest.mark.clause("RST-01")
@pytest.mark.needs("reset")
def test_rst01_requested_reset_of_healthy_device_within_budget(host, measurements):
    budget_ms = float(host.profile.budgets["reset_budget_ms"])
    slot, bdf, _record = healthy_device(host, "reset")
    runtime = host.runtime
    round_trips, runtime_ms = [], []
    for i in range(RESETS):
        mark = subscribe(runtime)
        t0 = time.monotonic_ns()
        result = runtime.call("reset", {"device": bdf}, timeout_s=max(CALL_TIMEOUT_S, 3 * budget_ms / 1e3))
        round_trips.append((time.monotonic_ns() - t0) / 1e6)
        runtime_ms.append(float(result["duration_ms"]))
        assert result["outcome"] == "ok", f"reset {i + 1} of {bdf} ({slot}) failed: {result}"
        assert result.get("checkpoint", {}).get("ok"), f"{bdf} not intact after reset {i + 1}: {result}"
        recorded = [e["data"] for e in runtime.events(mark, "reset")
                    if e["data"]["device"] == bdf and e["data"].get("source") == "request"]
        assert recorded and recorded[-1]["outcome"] == "ok", (
            f"reset {i + 1} of {bdf} answered {result['outcome']} but its reset event says {recorded}")
        record = runtime.call("device", {"device": bdf})
        moves = [(e["data"]["from"], e["data"]["to"], e["data"]["cause"])
                 for e in health_transitions(runtime, bdf, mark)]
        assert record["state"] == "HEALTHY" and not moves, (
            f"after reset {i + 1} {bdf} is {record['state']} (moves {moves}); a reset of a HEALTHY "
            f"device must leave it HEALTHY")
        assert record["in_pool"], f"{bdf} is HEALTHY but not allocatable after reset {i + 1}: {record}"

    measurements.record("RST-01", "runtime_reset_duration", runtime_ms, "ms")
    summary = measurements.record("RST-01", "requested_reset_round_trip", round_trips, "ms",
                                  budget=budget_ms, budget_stat="max")
    assert summary.within_budget, summary.text()
