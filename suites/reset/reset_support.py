"""Helpers of the RST suite: slot choice, the device's starting state, event selection.

Like the AER suite's helpers (suites/aer/aer_support.py), kept separate so the
two suites do not import each other.
"""

from __future__ import annotations

from hilconform.fixtures.runtime_waits import device_when_idle as device_when_settled  # noqa: F401
from hilconform.fixtures.runtime_waits import healthy_targets
from hilconform.fixtures.runtime_waits import subscribe_live as subscribe  # noqa: F401 (for the tests)

EVENT_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 30.0


def healthy_device(host, capability: str) -> tuple[str, str, dict]:
    """(target, bdf, record) of the first target with `capability` whose device is HEALTHY and free."""
    (target, record), = healthy_targets(host, capability)
    return target, record["device"], record


def health_transitions(runtime, bdf: str, after: int) -> list[dict]:
    return [e for e in runtime.events(after, "transition")
            if e["data"]["device"] == bdf and e["data"]["view"] == "health"]


def steps(runtime, bdf: str, after: int, procedure: str) -> list[dict]:
    return [e for e in runtime.events(after, "procedure")
            if e["data"]["device"] == bdf and e["data"]["procedure"] == procedure]
