"""An nvme namespace held open by a guest process keeps the removal's drain from reading empty.

Why: udev's blkid probes a namespace block after block; between two reads nothing is in flight.
A drain that sampled that moment cleared bus mastering, blkid's next read was lost and the
kernel's removal waited for it (LIFE-01 power_off timeouts on switch-stock). A runtime that
counts only requests in flight reports this drain `ok` with depth 0; the reference counts the
open file, so a holder that outlives the drain timeout makes the drain time out (and escalate,
HP-03's path) instead.
"""

from __future__ import annotations

import time

import pytest

from hilconform.fixtures.runtime_client import RuntimeCallError

HOLD_S = 4.0  # far longer than the 300 ms drain timeout
DEADLINE_S = 60.0


def _wait(probe, what: str, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


@pytest.mark.destructive
def test_a_namespace_held_open_makes_the_drain_wait(host_factory):
    host = host_factory.start(profile="a100-stock", hotplug_mode="native")
    runtime = host.runtime
    slot = next(s for s in host.profile.slots if s.device == "nvme")
    bdf = host.slot_bdf(slot.name)

    def healthy():
        try:
            record = runtime.call("device", {"device": bdf})
        except RuntimeCallError:  # not described yet
            return False
        return record["state"] == "HEALTHY" and record["busy"] is None

    _wait(healthy, f"{bdf} HEALTHY after boot")
    listing = host.run(["sh", "-c", f"ls -d /sys/bus/pci/devices/{bdf}/nvme/nvme*/nvme*n*"]).check()
    namespace = listing.stdout.split()[0].rsplit("/", 1)[-1]
    host.run(["sh", "-c", f"(exec 3</dev/{namespace}; sleep {HOLD_S}) </dev/null >/dev/null 2>&1 &"]).check()
    count = f"ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c ' /dev/{namespace}$' || true"
    _wait(lambda: int(host.run(["sh", "-c", count]).check().stdout.strip() or 0) > 0,
          f"a guest process holding /dev/{namespace} open")

    reply = runtime.call("remove", {"device": bdf}, timeout_s=DEADLINE_S)
    drain = reply["drain"]
    assert drain["status"] == "timeout" and drain["depth"] >= 1, (
        f"/dev/{namespace} was held open through the drain, yet the drain read {drain}")
    assert runtime.violations == []
