"""Helpers of the AER and RST suites: slot choice, the runtime's declared policy, event waits.

The suites judge the runtime by its own declared policy (`hello`'s config
summary, i.e. the configuration it was started with) and by independent
evidence: the guest kernel's AER counters and recovery lines (read by the
fault injector) and QEMU's bus tree. Nothing here imports the runtime.
"""

from __future__ import annotations

import math

import pytest

from hilconform.fixtures.config_evidence import config_lost  # noqa: F401 (for the tests)
from hilconform.fixtures.runtime_waits import (
    device_when_idle,
    healthy_targets,  # noqa: F401 (for the tests)
    poll_until,
)
from hilconform.fixtures.runtime_waits import subscribe_live as subscribe  # noqa: F401 (for the tests)

# Generous deadlines: TCG on a shared 2-core machine. A wait that runs out is a
# finding against the runtime (RuntimeUnresponsive), not a flake to retry.
EVENT_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 30.0
SEVERITY_ORDER = {"HEALTHY": 0, "DEGRADED": 1, "FAULTED": 2}



def ready_device(host, bdf: str) -> dict:
    """The runtime's record of `bdf` once cold discovery and its self-check are over; it must be
    HEALTHY to start."""
    record = device_when_idle(host, bdf, EVENT_TIMEOUT_S)
    assert record["state"] == "HEALTHY", (
        f"precondition: {bdf} should start HEALTHY, runtime says {record['state']} "
        f"(cause {record['last_cause']})")
    return record


def aer_policy(runtime) -> dict:
    """The AER policy the runtime declares in hello's config summary."""
    policy = (runtime.hello or {}).get("config", {}).get("aer")
    if not policy:
        policy = runtime.call("hello", {"client": "hilconform-suite"})["config"]["aer"]
    for key in ("nonfatal_recovered", "fatal_recovered", "half_life_s", "degrade_weight",
                "reset_weight", "fault_weight", "error_weight"):
        assert key in policy, f"hello's config.aer lacks {key!r}: {policy}"
    return policy


def expected_state(policy: dict, recovered: str, weight: float) -> str:
    """State the declared policy gives a device after a recovered error of `recovered` severity
    with error weight `weight`: the worst of the recovery policy and the weight thresholds."""
    states = [policy[f"{recovered}_recovered"].upper()]
    if weight >= policy["fault_weight"]:
        states.append("FAULTED")
    elif weight >= policy["degrade_weight"]:
        states.append("DEGRADED")
    return max(states, key=SEVERITY_ORDER.__getitem__)


def burst_size(policy: dict, severity: str = "nonfatal") -> int:
    """Errors in a 'short burst': at most half of what reaches reset_weight, so a runtime that
    counts an error twice (kernel line and recovery episode) still stays below it."""
    weight = float(policy["error_weight"][severity])
    if weight <= 0:
        pytest.skip(f"policy gives {severity} errors weight {weight}: they can never force a reset")
    return max(1, math.floor(policy["reset_weight"] / (2 * weight)))


def errors_to_reset(policy: dict, severity: str = "nonfatal") -> int:
    """Errors of `severity` whose undecayed weight reaches reset_weight."""
    return math.ceil(policy["reset_weight"] / float(policy["error_weight"][severity]))


def is_device(bdf: str):
    return lambda data: data.get("device") == bdf


def wait_aer(runtime, bdf: str, kind: str, after: int, timeout_s: float = EVENT_TIMEOUT_S,
             match=None) -> dict:
    """The first `aer` event of `kind` for `bdf` after `after` (the whole event: data, host_ns)."""
    return runtime.wait_event(
        "aer", after, timeout_s,
        match=lambda d: d["device"] == bdf and d["kind"] == kind and (match is None or match(d)),
        what=f"aer {kind} for {bdf}")


def wait_recovery_outcome(runtime, bdf: str, after: int, timeout_s: float = EVENT_TIMEOUT_S) -> dict:
    """The runtime's `aer` event closing a recovery episode of `bdf` (recovered or
    recovery_failed): the whole event (data, host_ns)."""
    return runtime.wait_event(
        "aer", after, timeout_s,
        match=lambda d: d["device"] == bdf and d["kind"] in ("recovered", "recovery_failed"),
        what=f"aer recovered/recovery_failed for {bdf}")


def health_transitions(runtime, bdf: str, after: int) -> list[dict]:
    return [e["data"] for e in runtime.events(after, "transition")
            if e["data"]["device"] == bdf and e["data"]["view"] == "health"]


def resets_of(runtime, bdf: str, after: int, source: str | None = None) -> list[dict]:
    return [e["data"] for e in runtime.events(after, "reset")
            if e["data"]["device"] == bdf and (source is None or e["data"].get("source") == source)]


def reset_runs(runtime, bdf: str, after: int, entry: str | None = None) -> list[dict]:
    """`procedure` begin steps of reset runs on `bdf` (optionally of one entry)."""
    return [e["data"] for e in runtime.events(after, "procedure")
            if e["data"]["device"] == bdf and e["data"]["procedure"] == "reset"
            and e["data"]["step"] == "begin" and (entry is None or e["data"]["entry"] == entry)]


def settle_state(runtime, bdf: str, timeout_s: float = EVENT_TIMEOUT_S) -> dict:
    """Ask for a checkpoint of `bdf` now (health_poll), retrying while it is skipped (busy,
    AER recovery in progress); returns its verdict {state, checkpoint, aer}."""
    def checkpoint() -> dict | None:
        verdict = runtime.call("health_poll", {"device": bdf}, timeout_s=CALL_TIMEOUT_S)["devices"][bdf]
        seen.append(verdict)
        return None if "skipped" in verdict else verdict

    seen: list[dict] = []
    return poll_until(checkpoint, timeout_s, f"a health_poll of {bdf} that is not skipped", every_s=0.5,
                      error=AssertionError, shown=lambda _: repr(seen[-1] if seen else None))


def require_kernel_recovery(record: dict) -> None:
    """Skip when no driver is bound (e.g. a device model whose file names no guest_driver): the
    kernel cannot recover the device from a non-fatal error (FAILED_RECOVERY at once, no
    BEGIN_RECOVERY)."""
    if record["info"].get("driver") is None:
        pytest.skip(f"{record['device']} has no driver bound: the kernel cannot recover it from a "
                    "non-fatal AER error, so recovered-error policies do not apply")


