"""The guest image starts the runtime; the host lists its inventory and sees a hot-add."""

from __future__ import annotations

import pytest

from hilconform.emulators.pci_inventory import function_below


def _subscribe_from_start(runtime) -> int:
    mark = runtime.mark()
    runtime.call("subscribe", {"since_seq": 0})
    return mark


def _managed_bdfs(host) -> set[str]:
    truth = host.ground_truth()
    bdfs = set()
    for slot in host.profile.slots:
        if slot.populated:
            bdfs.add(function_below(truth, slot.port_id))
    return bdfs


def test_runtime_reports_the_boot_inventory(host):
    runtime = host.runtime
    assert runtime.hello["protocol"] == 1
    mark = _subscribe_from_start(runtime)
    runtime.wait_event("inventory_complete", mark, timeout_s=30, what="cold discovery")
    inventory = runtime.call("inventory")
    assert inventory["complete"] is True
    listed = {d["device"] for d in inventory["devices"]}
    assert listed == _managed_bdfs(host)
    assert runtime.violations == []


@pytest.mark.destructive
def test_hot_added_device_appears_in_the_runtime(host):
    runtime = host.runtime
    mark = _subscribe_from_start(runtime)
    runtime.wait_event("inventory_complete", mark, timeout_s=30, what="cold discovery")
    slot = next(s for s in host.profile.slots if not s.populated)
    mark = runtime.mark()
    added = host.get("hot-add").hot_add(slot.name)
    event = runtime.wait_event("discovered", mark, timeout_s=20,
                               match=lambda d: d["device"] == added.bdf, what=added.bdf)
    assert event["host_ns"] > added.returned_ns
    listed = {d["device"] for d in runtime.call("inventory")["devices"]}
    assert added.bdf in listed
    assert runtime.violations == []
