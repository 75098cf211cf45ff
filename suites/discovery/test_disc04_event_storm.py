"""DISC-04 event storms: devices added within one 200 ms window are handled as one batch
(one `topology` rebuild covering every add) and all of them are discovered.

The storm: QMP `device_add` of the slots' stand-in model into two empty slots, the
second 120 ms after the first (a queue device gets a `null-co` block node made
beforehand instead of its NBD queue: discovery does not look at the medium; a device
model's server is started first, `host.serve_model`). 120 ms
is well inside the window yet far longer than the runtime takes to handle one add, so a
runtime that rebuilds per change, or whose window is much shorter than 200 ms, splits
the storm instead of merging changes that merely queued up while it was busy.
Whether the adds fall "within one 200 ms window" is decided where the runtime sees
them: an independent `udevadm monitor` in the guest timestamps udev's broadcast of each
PCI `add`. A storm the witness saw at most 180 ms apart (a 10% margin inside the window)
is judged; a wider one is undone and injected again (at most 5 attempts; if none lands
inside the window the storm could not be injected: an infrastructure error, not a
verdict). Every attempt must have all its devices discovered.

Judging: each add lands in exactly one batch, so the first `topology` rebuild carrying
`add` actions must count both adds and list both devices; after both self-checks ended
no other rebuild since the storm may carry an add. Native hot-plug is used whatever the
run's default: ACPI hot-plug spreads the same adds over 200-700 ms.
"""

from __future__ import annotations

import time

import pytest
from discovery_support import (
    GuestUdevWitness,
    bdf_in_slot,
    empty_slots,
    guest_quiet,
    ms_between,
    wait_boot_self_checks,
    wait_discovered,
    wait_removed,
    wait_settled,
)

from hilconform.emulators.errors import InfrastructureError

pytestmark = [pytest.mark.clause("DISC-04"), pytest.mark.destructive, pytest.mark.slow]

STORM_WINDOW_MS = 200.0  # the clause's window
JUDGED_SPREAD_MS = 180.0  # storms the witness saw within this are judged
MAX_ATTEMPTS = 5
PAUSE_MS = 120.0  # between the two device_adds
HOST_SPREAD_MS = (PAUSE_MS, PAUSE_MS + 50.0)  # the device_adds must return this far apart
BATCH_TIMEOUT_S = 20.0
STORM_DISK_BYTES = 64 << 20


def _null_drive(host, slot) -> str | None:
    """A block node for a queue stand-in (None for devices without one), made before the storm."""
    kind = host.profile.kind(slot.accepts)
    if kind.queue == "none" or kind.model:
        return None
    node = f"storm-{slot.name}-null"
    host.vm.qmp.execute("blockdev-add", {"driver": "null-co", "node-name": node, "size": STORM_DISK_BYTES})
    return node


def _inject_storm(host, slots, drives: dict, attempt: int) -> list[str]:
    """device_add into every slot, PAUSE_MS apart; returns the qdev ids."""
    props = []
    for slot in slots:
        kind = host.profile.kind(slot.accepts)
        device = {"driver": kind.qemu_driver, "id": f"storm{attempt}-{slot.name}",
                  "bus": slot.port_id, "addr": "0"}
        if kind.model:  # its server must listen before device_add
            device = host.serve_model(slot.name, device["id"])
        elif drives[slot.name]:
            device.update(drive=drives[slot.name], serial=f"S{attempt}-{slot.name.upper()}"[:20])
        props.append(device)
    returned_ns = []
    for index, device in enumerate(props):
        if index:
            time.sleep(PAUSE_MS / 1000)  # the storm's shape, not a wait for anything
        host.vm.qmp.execute("device_add", device)
        returned_ns.append(time.monotonic_ns())
    spread_ms = ms_between(returned_ns[0], returned_ns[-1])
    if not HOST_SPREAD_MS[0] <= spread_ms < HOST_SPREAD_MS[1]:
        raise InfrastructureError(f"storm not injected: the device_adds returned {spread_ms:.0f} ms apart "
                                  f"(need {HOST_SPREAD_MS[0]:.0f}-{HOST_SPREAD_MS[1]:.0f} ms)")
    unlisted = [d["id"] for d in props if d["id"] not in {f.qdev_id for f in host.ground_truth()}]
    if unlisted:
        raise InfrastructureError(f"device_add of {unlisted} returned but QEMU does not list them")
    return [d["id"] for d in props]


def _undo(host, runtime, qdev_ids: list[str], bdfs: list[str]) -> None:
    for qdev_id, bdf in zip(qdev_ids, bdfs, strict=True):
        guest_quiet(host, bdf)
        mark = runtime.mark()
        host.remove(qdev_id)
        wait_removed(runtime, bdf, mark)
    guest_quiet(host)  # no stale removal events in the next storm's batch


def test_adds_within_one_window_are_one_batch(host_factory, measurements):
    host = host_factory.start(hotplug_mode="native")
    slots = empty_slots(host)[:2]
    if len(slots) < 2:
        pytest.skip(f"profile {host.profile.name} has fewer than two empty hot-plug slots")
    runtime = host.runtime
    wait_boot_self_checks(runtime)
    drives = {slot.name: _null_drive(host, slot) for slot in slots}
    spreads: list[float] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        witness = GuestUdevWitness(host)
        mark = runtime.mark()
        try:
            qdev_ids = _inject_storm(host, slots, drives, attempt)
            bdfs = [bdf_in_slot(host, slot.name) for slot in slots]
            announced = {bdf: wait_discovered(runtime, bdf, mark) for bdf in bdfs}
            runtime.wait_event("topology", mark, BATCH_TIMEOUT_S,
                               match=lambda d: bool((d.get("actions") or {}).get("add")),
                               what="the topology rebuild of the storm's batch")
            for bdf in bdfs:
                wait_settled(runtime, bdf, mark)
        finally:
            seen = witness.stop()
        listed = {d["device"] for d in runtime.call("inventory")["devices"]}
        assert set(bdfs) <= listed, f"not in the inventory after the storm: {sorted(set(bdfs) - listed)}"
        adds = {bdf: ms for ms, action, bdf in seen if action == "add" and bdf in bdfs}
        if set(adds) != set(bdfs):
            raise InfrastructureError(f"the guest's udev witness saw adds of {sorted(adds)}, not {bdfs}")
        spread = max(adds.values()) - min(adds.values())
        spreads.append(spread)
        if spread <= JUDGED_SPREAD_MS:
            break
        _undo(host, runtime, qdev_ids, bdfs)
    else:
        raise InfrastructureError(f"no storm reached the guest within {JUDGED_SPREAD_MS:.0f} ms in "
                                  f"{MAX_ATTEMPTS} attempts (udev spreads {[round(s) for s in spreads]} ms)")
    measurements.record("DISC-04", "storm_udev_spread", spreads, "ms")

    rebuilds = [e["data"] for e in runtime.events(mark, "topology")]
    with_adds = [t for t in rebuilds if (t.get("actions") or {}).get("add")]
    read = [announced[b]["data"].get("udev_received_ns") for b in bdfs]
    runtime_spread = (f"{ms_between(min(read), max(read)):.0f} ms"
                      if all(isinstance(r, int) for r in read) else "unknown")
    context = (f"udev broadcast the {len(bdfs)} adds {spread:.0f} ms apart (the runtime says it read "
               f"them {runtime_spread} apart); topology events since the storm: "
               f"{[(t['generation'], t.get('cause'), t.get('actions')) for t in rebuilds]}")
    assert len(with_adds) == 1, f"handled in {len(with_adds)} rebuilds with adds, not one: {context}"
    batch = with_adds[0]
    assert batch["actions"]["add"] == len(bdfs), f"the batch counts {batch['actions']['add']} adds: {context}"
    assert set(bdfs) <= set(batch["devices"]), (
        f"the storm's rebuild lists {batch['devices']}, missing {sorted(set(bdfs) - set(batch['devices']))}")
    assert runtime.violations == []
