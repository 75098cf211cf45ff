"""AER-01: an uncorrectable non-fatal error is counted, its recovery observed, the state per policy.

The error is injected at the root port above a device (HMP pcie_aer_inject_error);
the guest kernel counts it on the port, recovers the device below it (udev
BEGIN_RECOVERY / SUCCESSFUL_RECOVERY) and does not reset the link. The runtime
must attribute the error to the device, see the recovery, and leave the device
in the state its declared policy (`hello` config.aer) gives.
"""

from __future__ import annotations

import pytest
from aer_support import (
    aer_policy,
    expected_state,
    health_transitions,
    healthy_targets,
    ready_device,
    require_kernel_recovery,
    resets_of,
    settle_state,
    subscribe,
    wait_aer,
    wait_recovery_outcome,
)


@pytest.mark.clause("AER-01")
@pytest.mark.destructive
@pytest.mark.needs("aer-nonfatal")
def test_aer01_nonfatal_error_counted_recovered_state_per_policy(host, measurements):
    slot, _ = healthy_targets(host, "aer-nonfatal")[0]
    bdf = host.target_bdf(slot)
    runtime = host.runtime
    before = ready_device(host, bdf)
    require_kernel_recovery(before)
    policy = aer_policy(runtime)
    mark = subscribe(runtime)

    fault = host.get("aer-nonfatal").aer_nonfatal(slot, wait_recovery=True)
    kernel_recovery = fault.details["recovery"]  # the guest kernel's own verdict (dmesg)

    counted = wait_aer(runtime, bdf, "counted", mark, match=lambda d: d["delta"]["nonfatal"] > 0)
    closing = wait_recovery_outcome(runtime, bdf, mark)
    outcome = closing["data"]
    begins = [e["data"] for e in runtime.events(mark, "aer")
              if e["data"]["device"] == bdf and e["data"]["kind"] == "begin_recovery"]
    assert begins, f"runtime reported {outcome['kind']} for {bdf} without a begin_recovery event"

    if kernel_recovery == "failed":
        assert outcome["kind"] == "recovery_failed", (
            f"kernel says recovery of {bdf} failed; runtime says {outcome}")
        expected = "FAULTED"
    else:
        assert outcome["kind"] == "recovered", f"kernel recovered {bdf}; runtime says {outcome}"
        assert outcome["severity"] == "nonfatal", f"runtime took a non-fatal error for {outcome}"
        expected = expected_state(policy, "nonfatal", outcome["weight"])

    after = runtime.call("device", {"device": bdf})
    nonfatal_delta = after["aer"]["counts"]["nonfatal"] - before["aer"]["counts"]["nonfatal"]
    assert nonfatal_delta == 1, (
        f"one non-fatal error injected at the port above {bdf}; runtime counts {nonfatal_delta} "
        f"(before {before['aer']['counts']}, after {after['aer']['counts']})")
    assert after["aer"]["counts"]["fatal"] == before["aer"]["counts"]["fatal"], after["aer"]
    assert not resets_of(runtime, bdf, mark, "kernel_aer"), (
        "a non-fatal error does not reset the link, yet the runtime recorded a kernel_aer reset")

    verdict = settle_state(runtime, bdf)
    moves = [(t["from"], t["to"], t["cause"]) for t in health_transitions(runtime, bdf, mark)]
    assert after["state"] == expected and verdict["state"] == expected, (
        f"policy {policy['nonfatal_recovered']} (weight {outcome.get('weight')}, degrade at "
        f"{policy['degrade_weight']}, fault at {policy['fault_weight']}) gives {expected}; runtime "
        f"says {after['state']} then {verdict['state']} after a health poll; moves {moves}")

    measurements.record("AER-01", "nonfatal_injected_to_counted",
                        [(counted["host_ns"] - fault.injected_ns) / 1e6], "ms")
    measurements.record("AER-01", "nonfatal_injected_to_recovery_event",
                        [(closing["host_ns"] - fault.injected_ns) / 1e6], "ms")
