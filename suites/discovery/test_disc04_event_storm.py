"""DISC-04 event storms: devices added within one 200 ms window are handled as one batch
(one `topology` rebuild covering every add), all of them are discovered, however many
arrive, up to every empty slot of the host, and each within the hot-add budget.

The storm: QMP `device_add` of the slots' stand-in model into EVERY empty slot of the host
(at least two; a host built for storms has four or more), spread evenly over 120 ms. Each
slot's unit is made ready first (`host.unit(slot).add_properties`: a queue device gets a
`null-co` block node instead of its NBD queue, discovery does not look at the medium; a
device model's server is started), so only the device_adds are timed. 120 ms is well inside
the window yet far longer than the runtime takes to read one change, so a runtime that
rebuilds per change, whose window is much shorter than 200 ms, or that reads the next change
only after it has described the last one, splits the storm instead of merging changes that
merely queued up while it was busy.

Whether adds fall "within one 200 ms window" is decided where the runtime could see them:
an independent `udevadm monitor --kernel` in the guest (at raised priority) timestamps the
kernel's PCI `add` uevents. The adds it saw within 150 ms of the storm's first (a 25% margin
for two observers' jitter on a busy TCG guest) must all be in the storm's first batch. Under
TCG pciehp enumerates one slot at a time, so of a 16-device storm only the first few land
in that window; a storm with fewer than two inside it is undone and injected again (at most
5 attempts, then an infrastructure error, not a verdict). Every attempt must have all its
devices discovered.

Judging: the first `topology` rebuild carrying `add` actions lists and counts every add the
witness saw inside the window; the rebuilds together count each add once and the last lists
every device; each device's latency (its `device_add` returned on the host -> its
`discovered` event received on the host, as DISC-02 measures one add), less the kernel's
queueing behind the storm's other slots (how much later than its `device_add`'s own offset
in the storm the kernel announced it), is within the hot-add budget, judged as DISC-02 judges
one add (fixtures/floor_judgement.py): where the profile sets `hot_add_discovery_over_floor_p95_ms`
(emulated hosts) the runtime's own share (the kernel's add uevent -> its `discovered`, on the
guest's clock) is judged, per device, and a test bed whose floor is over
`hot_add_floor_limit_p95_ms` makes a late share inconclusive; otherwise (real hosts) the whole
figure against `hot_add_discovery_p95_ms`.
Native hot-plug is used whatever the run's default: ACPI hot-plug spreads the same adds over
200-700 ms.
"""

from __future__ import annotations

import time

import pytest
from discovery_support import (
    GuestUeventWitness,
    bdf_in_slot,
    empty_slots,
    guest_quiet,
    ms_between,
    wait_boot_self_checks,
    wait_discovered,
    wait_removed,
    wait_self_check_end,
)

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.floor_judgement import FloorBudgets, judge_over_floor
from hilconform.fixtures.host_protocol import HotPlug
from hilconform.fixtures.stall_witness import stalled_ms

pytestmark = [pytest.mark.clause("DISC-04"), pytest.mark.destructive, pytest.mark.slow]

STORM_WINDOW_MS = 200.0  # the clause's window
JUDGED_SPREAD_MS = 150.0  # adds the witness saw within this of the first must share a batch
MAX_ATTEMPTS = 5
STORM_SPAN_MS = 120.0  # first device_add to last, spread evenly
BATCH_TIMEOUT_S = 30.0
HOT_ADD_BUDGETS = FloorBudgets(absolute="hot_add_discovery_p95_ms",  # DISC-02's, per device here
                               share="hot_add_discovery_over_floor_p95_ms",
                               floor_limit="hot_add_floor_limit_p95_ms",
                               stall_limit="hot_add_stall_limit_ms")


def _inject_storm(host, slots, attempt: int) -> dict[str, int]:
    """device_add into every slot, spread over STORM_SPAN_MS; qdev id -> host ns it returned."""
    hotplug = host.get("hot-add")
    props = [host.unit(slot.name).add_properties(f"storm{attempt}-{slot.name}", medium="null")
             for slot in slots]
    pause_s = STORM_SPAN_MS / 1000 / (len(props) - 1)
    returned_ns: dict[str, int] = {}
    start = time.monotonic()
    for index, device in enumerate(props):
        planned = start + index * pause_s
        time.sleep(max(0.0, planned - time.monotonic()))  # the storm's shape, not a wait for anything
        returned_ns[device["id"]] = hotplug.hot_add_prepared(device)
    # A storm the host sent slower than planned (a loaded host: CI saw 190 ms for 2 adds) is judged
    # all the same: which adds count as one window is decided by the guest's witness, not here.
    unlisted = [q for q in returned_ns if q not in {f.qdev_id for f in host.ground_truth()}]
    if unlisted:
        raise InfrastructureError(f"device_add of {unlisted} returned but QEMU does not list them")
    return returned_ns


def _undo(host, runtime, qdev_ids: list[str], bdfs: list[str]) -> None:
    for qdev_id, bdf in zip(qdev_ids, bdfs, strict=True):
        guest_quiet(host, bdf)
        mark = runtime.mark()
        host.get(HotPlug).remove(qdev_id)
        wait_removed(runtime, bdf, mark)
    guest_quiet(host)  # no stale removal events in the next storm's batch


def _storm_shape(seen, bdfs, returned_ms) -> tuple[dict[str, float], list[str], dict[str, float]]:
    """Per device, the kernel's queueing (ms) beyond its device_add's own offset in the storm;
    the devices the kernel announced within JUDGED_SPREAD_MS of the storm's first add; and
    when the witness saw each add (guest monotonic ms)."""
    adds = {}
    for ms, action, bdf in seen:
        if action == "add" and bdf in bdfs:
            adds.setdefault(bdf, ms)
    if set(adds) != set(bdfs):
        raise InfrastructureError(f"the guest's uevent witness saw adds of {sorted(adds)}, not {bdfs}")
    first_kernel, first_add = min(adds.values()), min(returned_ms.values())
    queueing = {b: max(0.0, (adds[b] - first_kernel) - (returned_ms[b] - first_add)) for b in bdfs}
    within = sorted((b for b in bdfs if adds[b] - first_kernel <= JUDGED_SPREAD_MS), key=adds.get)
    return queueing, within, adds


@pytest.mark.needs("hot-add", "qmp")  # every empty slot of the profile at once
def test_a_storm_into_every_empty_slot_is_one_batch_each_discovered_in_time(host_factory, measurements):
    host = host_factory.fresh(hotplug_mode="native")
    slots = empty_slots(host)
    if len(slots) < 2:
        pytest.skip(f"profile {host.profile.name} has fewer than two empty hot-plug slots")
    runtime = host.runtime
    wait_boot_self_checks(runtime)
    counts: list[int] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        stall_witness = host.stall_witness()  # the acting thread's stalls inside each share
        witness = GuestUeventWitness(host)
        mark = runtime.mark()
        try:
            returned = _inject_storm(host, slots, attempt)
            qdev_ids = list(returned)
            bdfs = [bdf_in_slot(host, slot.name) for slot in slots]
            announced = {bdf: wait_discovered(runtime, bdf, mark, timeout_s=BATCH_TIMEOUT_S) for bdf in bdfs}
            runtime.wait_event(
                "topology",
                mark,
                BATCH_TIMEOUT_S,
                match=lambda d: bool((d.get("actions") or {}).get("add")),
                what="the topology rebuild of the storm's batch",
            )
            for bdf in bdfs:
                wait_self_check_end(runtime, bdf, mark)
        finally:
            seen = witness.stop()
            stalls = stall_witness.stop()
        listed = {d["device"] for d in runtime.call("inventory")["devices"]}
        assert set(bdfs) <= listed, f"not in the inventory after the storm: {sorted(set(bdfs) - listed)}"
        returned_ms = {bdf: returned[q] / 1e6 for q, bdf in zip(qdev_ids, bdfs, strict=True)}
        queueing, within, kernel_ms = _storm_shape(seen, bdfs, returned_ms)
        counts.append(len(within))
        if len(within) >= 2:
            break
        _undo(host, runtime, qdev_ids, bdfs)
    else:
        raise InfrastructureError(
            f"no two adds of a storm reached the guest within {JUDGED_SPREAD_MS:.0f} ms "
            f"in {MAX_ATTEMPTS} attempts (adds inside per attempt: {counts})"
        )
    latency = {
        bdf: ms_between(returned[q], announced[bdf]["host_ns"]) for q, bdf in zip(qdev_ids, bdfs, strict=True)
    }
    judged = {bdf: latency[bdf] - queueing[bdf] for bdf in bdfs}
    # The runtime's own share of each: the kernel's add uevent (the witness) -> its `discovered`
    # event, both on the guest's clock; the rest of the judged latency is the test bed's floor.
    shares = {bdf: announced[bdf]["ts_ns"] / 1e6 - kernel_ms[bdf] for bdf in bdfs}
    measurements.record("DISC-04", "storm_devices", [len(bdfs)], "devices")
    measurements.record("DISC-04", "storm_devices_within_window", [len(within)], "devices")
    measurements.record("DISC-04", "storm_kernel_queueing", list(queueing.values()), "ms")
    measurements.record("DISC-04", "storm_discovery_latency", list(latency.values()), "ms")

    rebuilds = [e["data"] for e in runtime.events(mark, "topology")]
    with_adds = [t for t in rebuilds if (t.get("actions") or {}).get("add")]
    read = [announced[b]["data"].get("udev_received_ns") for b in bdfs]
    runtime_spread = (
        f"{ms_between(min(read), max(read)):.0f} ms" if all(isinstance(r, int) for r in read) else "unknown"
    )
    first_ms = min(kernel_ms.values())
    timeline = {
        b: (round(kernel_ms[b] - first_ms), round(r / 1e6 - first_ms) if isinstance(r, int) else None)
        for b, r in sorted(zip(bdfs, read, strict=True), key=lambda br: kernel_ms[br[0]])
    }
    context = (
        f"{len(within)} of the {len(bdfs)} adds announced by the kernel within {JUDGED_SPREAD_MS:.0f} ms "
        f"of the first (the runtime says it read all {len(bdfs)} within {runtime_spread}); per device "
        f"(kernel announced, runtime read) ms after the first announcement: {timeline}; topology "
        f"events since the storm: {[(t['generation'], t.get('cause'), t.get('actions')) for t in rebuilds]}"
    )
    assert with_adds, f"no topology rebuild counts an add: {context}"
    first = with_adds[0]
    missing = sorted(set(within) - set(first["devices"]))
    assert not missing and first["actions"]["add"] >= len(within), (
        f"the storm's first rebuild counts {first['actions']['add']} adds and lacks {missing}, although the "
        f"kernel announced them within one window: {context}"
    )
    counted = sum(t["actions"]["add"] for t in with_adds)
    assert counted == len(bdfs), f"the rebuilds count {counted} adds for {len(bdfs)} devices: {context}"
    assert set(bdfs) <= set(with_adds[-1]["devices"]), (
        f"the storm's last rebuild lacks {sorted(set(bdfs) - set(with_adds[-1]['devices']))}: {context}"
    )
    assert runtime.violations == []
    # Each device within the hot-add budget, judged as DISC-02 judges one add: over the floor
    # where the profile says so (a loaded test bed is inconclusive, never a failure), else whole.
    # Each share less the acting thread's stalls inside it (the guest's virtual CPUs': the runtime's
    # own wait for a CPU), bounded by hot_add_stall_limit_ms; the floor's part is left whole.
    stalled = [stalled_ms(stalls, int(kernel_ms[b] * 1e6), announced[b]["ts_ns"], acting=True) for b in bdfs]
    judge_over_floor(host, measurements, "DISC-04", "storm_discovery_latency_less_kernel_queueing",
                     [judged[b] for b in bdfs], [judged[b] - shares[b] for b in bdfs], HOT_ADD_BUDGETS,
                     stat="max", stalls=(stalled, [0.0] * len(bdfs)))
