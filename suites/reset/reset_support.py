"""Helpers of the RST suite: slot choice, the device's starting state, event selection.

Like the AER suite's helpers (suites/aer/aer_support.py), kept separate so the
two suites do not import each other.
"""

from __future__ import annotations

import time

from hilconform.fixtures.runtime_waits import subscribe_live as subscribe  # noqa: F401 (for the tests)

EVENT_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 30.0


def device_when_settled(host, bdf: str, timeout_s: float = EVENT_TIMEOUT_S) -> dict:
    """The runtime's record of `bdf` once cold discovery and its self-check (or any procedure
    on it) are over."""
    inventory = host.settled_inventory()
    assert bdf in {d["device"] for d in inventory["devices"]}, f"runtime does not manage {bdf}"
    deadline = time.monotonic() + timeout_s
    record = host.runtime.call("device", {"device": bdf})
    while (record["state"] == "DISCOVERED" or record["busy"]) and time.monotonic() < deadline:
        time.sleep(0.1)  # bounded by the deadline
        record = host.runtime.call("device", {"device": bdf})
    return record


def healthy_device(host, capability: str) -> tuple[str, str, dict]:
    """(slot, bdf, record) of the first populated slot with `capability` whose device is HEALTHY."""
    seen = {}
    for slot in host.targets(capability):
        bdf = host.target_bdf(slot)
        record = device_when_settled(host, bdf)
        if record["state"] == "HEALTHY" and not record["lease"]:
            return slot, bdf, record
        seen[bdf] = (record["state"], record["lease"])
    raise AssertionError(f"precondition: no free HEALTHY device with {capability!r}: {seen}")


def health_transitions(runtime, bdf: str, after: int) -> list[dict]:
    return [e for e in runtime.events(after, "transition")
            if e["data"]["device"] == bdf and e["data"]["view"] == "health"]


def steps(runtime, bdf: str, after: int, procedure: str) -> list[dict]:
    return [e for e in runtime.events(after, "procedure")
            if e["data"]["device"] == bdf and e["data"]["procedure"] == procedure]
