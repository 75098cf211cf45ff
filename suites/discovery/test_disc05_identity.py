"""DISC-05 identity: a device's fingerprint is stable across runtime restarts and guest
reboots; two devices of the same model get distinct identities; a device whose identity
changes in place is flagged.

Devices are followed by where QEMU put them (the qdev id of the device in each slot),
not by the runtime's own naming. "In place" means a different unit appears at a
location without the runtime having seen an orderly removal there: a removal without
warning (ACPI hot-plug) followed by a unit with another serial number in the same slot,
or a swap while the runtime was not running. A re-add of the same unit is not a change
and must not be flagged. A unit's serial number is the nvme stand-in's `serial` property,
or a device model's Device Serial Number (DSN capability), as a real card's.
"""

from __future__ import annotations

import pytest
from discovery_support import (
    bdf_in_slot,
    guest_quiet,
    qemu_functions,
    subscribe_from_start,
    wait_boot_self_checks,
    wait_discovered,
    wait_removed,
    wait_self_check_end,
)

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.host_protocol import HotPlug

pytestmark = pytest.mark.clause("DISC-05")

IDENTITY_TIMEOUT_S = 10.0
ORDERLY_REMOVAL_TIMEOUT_S = 30.0


def _by_slot(host) -> dict[str, dict]:
    """Runtime records keyed by the qdev id QEMU gives the device at their BDF."""
    functions = qemu_functions(host)
    inventory = host.settled_inventory()
    return {getattr(functions.get(d["device"]), "qdev_id", "") or d["device"]: d
            for d in inventory["devices"]}


def _fingerprints(host) -> dict[str, str]:
    return {slot: record["fingerprint"] for slot, record in _by_slot(host).items()}


def _flagged(host) -> list[str]:
    return sorted(slot for slot, record in _by_slot(host).items() if record["identity_changed"])


def _serial_slots(host, count: int) -> list:
    """`count` populated slots whose unit carries a serial number (skip when too few)."""
    slots = [s for s in host.profile.slots if s.populated and host.unit(s.name).has_identity]
    if len(slots) < count:
        pytest.skip(f"profile {host.profile.name} has fewer than {count} stand-ins with a serial "
                    "number (QEMU's edu device has neither serial nor DSN: its identity is its slot)")
    return slots[:count]


@pytest.mark.needs("qmp")
def test_same_model_devices_have_distinct_fingerprints(host):
    records = host.settled_inventory()["devices"]
    by_model: dict[str, list[dict]] = {}
    for record in records:
        info = record["info"]
        model = (f"{info['vendor_id']}:{info['device_id']} "
                 f"{info['subsystem_vendor_id']}:{info['subsystem_id']}")
        by_model.setdefault(model, []).append(record)
    if max((len(group) for group in by_model.values()), default=0) < 2:
        pytest.skip(f"profile {host.profile.name} has no two managed devices of one model")
    fingerprints = [r["fingerprint"] for r in records]
    unnamed = [r["device"] for r in records if not r["fingerprint"]]
    assert not unnamed, f"devices without a fingerprint: {unnamed}"
    duplicates = sorted({fp for fp in fingerprints if fingerprints.count(fp) > 1})
    assert not duplicates, (
        f"devices share fingerprints {duplicates}: "
        f"{[(r['device'], r['fingerprint']) for r in records if r['fingerprint'] in duplicates]}")
    for record in records:  # a fingerprint names its device in the protocol
        assert host.runtime.call("device", {"device": record["fingerprint"]})["device"] == record["device"]


def _fingerprints_by_bdf(host) -> dict[str, str]:
    return {d["device"]: d["fingerprint"] for d in host.settled_inventory()["devices"]}


@pytest.mark.slow
def test_fingerprints_survive_a_runtime_restart(host):
    """Any host: the runtime stopped and started again on the node (same config, same identity
    store) lists every device under the same BDF and fingerprint, and flags none as changed."""
    before = _fingerprints_by_bdf(host)
    assert before, f"profile {host.profile.name} puts no managed device on the host"
    host.restart_runtime()
    runtime = host.runtime
    mark = subscribe_from_start(runtime)
    records = host.settled_inventory()["devices"]
    after = {d["device"]: d["fingerprint"] for d in records}
    assert after == before, f"fingerprints changed across a runtime restart: {before} -> {after}"
    assert not any(d["identity_changed"] for d in records), (
        f"a runtime restart flagged unchanged devices as changed in place: {records}")
    assert runtime.events(mark, "identity_changed") == []
    assert runtime.violations == []


@pytest.mark.destructive
@pytest.mark.slow
@pytest.mark.needs("reboot")
def test_fingerprints_survive_a_guest_reboot(host_factory):
    """Followed by where QEMU put each unit (its qdev id), across a reboot of the whole guest."""
    host = host_factory.fresh(allow_reboot=True)
    before = _fingerprints(host)
    assert before, "no managed devices to follow"
    host.get("reboot").reboot()
    after_reboot = _fingerprints(host)
    assert after_reboot == before, (
        f"fingerprints changed across a guest reboot: {before} -> {after_reboot}")
    assert _flagged(host) == [], "a guest reboot flagged unchanged devices as changed in place"


class InPlace:
    """One slot whose unit the test replaces; tracks QEMU's current device id and the unit's
    serial (whatever stands in the slot: `host.unit` knows how it carries one)."""

    def __init__(self, host, slot):
        self.host, self.slot = host, slot
        self.qdev_id = slot.name
        self.backend = host.unit(slot.name)
        self.serial = self.backend.identity(slot.name)
        self.bdf = bdf_in_slot(host, slot.name)
        self.units = 0

    def reported(self, record: dict):
        """The unit's serial as the runtime's record shows it."""
        return self.backend.reported_identity(record)

    @property
    def expected(self):
        return self.backend.identity_text(self.serial)

    def remove(self, runtime, quiet: bool = True) -> dict:
        """Remove the slot's unit (on an ACPI host: without warning); the runtime's `removed`."""
        if quiet:
            guest_quiet(self.host, self.bdf)
        mark = runtime.mark()
        self.host.get(HotPlug).remove(self.qdev_id)
        return wait_removed(runtime, self.bdf, mark)

    def remove_through_runtime(self, runtime) -> dict:
        """The orderly removal: the runtime's `remove` (isolate, drain, power the slot off), then
        QEMU's DEVICE_DELETED; returns the runtime's `removed`."""
        guest_quiet(self.host, self.bdf)
        mark, departures = runtime.mark(), self.host.get(HotPlug).departures()
        result = runtime.call("remove", {"device": self.bdf}, timeout_s=ORDERLY_REMOVAL_TIMEOUT_S)
        if not result.get("ok"):
            raise InfrastructureError(f"the runtime's orderly removal of {self.bdf} did not finish: {result}")
        removed = wait_removed(runtime, self.bdf, mark)
        if departures.wait_gone(self.bdf, ORDERLY_REMOVAL_TIMEOUT_S) is None:
            raise InfrastructureError(f"{self.bdf} still on the host {ORDERLY_REMOVAL_TIMEOUT_S:.0f}s after "
                                      "the runtime's orderly removal")
        return removed

    def insert(self, serial=None) -> None:
        """Insert a unit: the same one again (serial None) or another of the same model."""
        self.units += 1
        self.qdev_id = f"{self.slot.name}-unit{self.units}"
        self.serial = serial or self.serial
        added = self.backend.insert(self.qdev_id, self.serial)
        if added.bdf != self.bdf:
            raise InfrastructureError(f"{self.qdev_id} went in at {added.bdf}, not {self.bdf}")

    def other_serial(self):
        return self.backend.other_identity(self.serial, self.units + 1)


def _await_flag(runtime, unit: InPlace, mark: int) -> str | None:
    """None when `unit`'s BDF was flagged (event and record), else what went wrong."""
    try:
        event = runtime.wait_event("identity_changed", mark, IDENTITY_TIMEOUT_S,
                                   match=lambda d: d["device"] == unit.bdf,
                                   what=f"identity_changed for {unit.bdf} (new serial {unit.expected})")
    except AssertionError as exc:
        record = runtime.call("device", {"device": unit.bdf})
        return (f"{exc}; its record: identity_changed={record['identity_changed']}, "
                f"serial={unit.reported(record)!r}, basis={record['info']['identity_basis']!r}")
    record = runtime.call("device", {"device": unit.bdf})
    if record["identity_changed"] is not True:
        return f"identity_changed event sent for {unit.bdf} but its record is not flagged"
    if event["data"]["fingerprint"] != record["fingerprint"]:
        return (f"identity_changed names fingerprint {event['data']['fingerprint']}, "
                f"the record has {record['fingerprint']}")
    return None


@pytest.mark.destructive
@pytest.mark.slow
@pytest.mark.needs("hot-add", "qmp")
def test_identity_change_in_place_is_flagged(host_factory):
    """Four cases on an ACPI hot-plug host (removal without warning), two slots A and B:

    1. A's unit vanishes and the same unit comes back: not flagged (control).
    2. B's unit vanishes and another unit (other serial) appears in B: flagged.
    3. As 2 in A, but udevd's events of the removal never come (the guest's udevd is
       held while the device goes): a runtime listening to udevd learns of it by polling,
       one listening to the kernel's own uevents (the reference) hears the kernel; flagged
       all the same.
    4. B's unit is swapped while the runtime is not running: flagged when it starts.
    5. A's unit is taken out by the runtime's own orderly removal and another unit is
       added to A: flagged, and reported with its own serial and a fingerprint of its
       own (never the removed unit's, cached).

    Every case is checked; the test reports all that went wrong.
    """
    host = host_factory.fresh(hotplug_mode="acpi")
    slot_a, slot_b = _serial_slots(host, 2)
    runtime = host.runtime
    wait_boot_self_checks(runtime)
    assert _flagged(host) == [], "devices flagged as changed before anything changed"
    a, b = InPlace(host, slot_a), InPlace(host, slot_b)
    fingerprint_a = runtime.call("device", {"device": a.bdf})["fingerprint"]
    problems: list[str] = []

    # 1. same unit back
    a.remove(runtime)
    mark = runtime.mark()
    a.insert()
    wait_discovered(runtime, a.bdf, mark)
    wait_self_check_end(runtime, a.bdf, mark)
    record = runtime.call("device", {"device": a.bdf})
    if a.reported(record) != a.expected:
        problems.append(f"case 1: runtime never read the serial of the re-added unit in {a.slot.name}: "
                        f"{a.reported(record)!r}, expected {a.expected!r}")
    if record["identity_changed"] or any(e["data"]["device"] == a.bdf
                                         for e in runtime.events(mark, "identity_changed")):
        problems.append(f"case 1: re-adding the same unit to {a.slot.name} was flagged as a change")
    if record["fingerprint"] != fingerprint_a:
        problems.append(f"case 1: the same unit came back with fingerprint {record['fingerprint']}, "
                        f"was {fingerprint_a}")

    # 2. another unit after a removal without warning
    removed = b.remove(runtime)
    mark = runtime.mark()
    b.insert(b.other_serial())
    why = _await_flag(runtime, b, mark)
    if why:
        problems.append(f"case 2 (removed with cause {removed['data']['cause']!r}): {why}")
    wait_self_check_end(runtime, b.bdf, mark)

    # 3. another unit after a removal the runtime can only learn by polling
    udevd = host.shell("pidof systemd-udevd | tr ' ' '\\n' | sort -n | head -n1").stdout.strip()
    if not udevd.isdigit():
        raise InfrastructureError("cannot find the guest's udevd to hold its events")
    guest_quiet(host, a.bdf)
    host.shell(f"kill -STOP {udevd}").check()
    try:
        removed = a.remove(runtime, quiet=False)
    finally:
        host.shell(f"kill -CONT {udevd}").check()
    mark = runtime.mark()
    a.insert(a.other_serial())
    why = _await_flag(runtime, a, mark)
    if why:
        problems.append(f"case 3 (removal learnt with cause {removed['data']['cause']!r}): {why}")
    wait_self_check_end(runtime, a.bdf, mark)

    # 4. another unit while the runtime is down
    guest_quiet(host, b.bdf)
    stopped = host.shell("pid=$(cat /run/hilconform/runtime.pid); kill -TERM $pid; "
                         "for i in $(seq 100); do kill -0 $pid 2>/dev/null || exit 0; sleep 0.1; done; "
                         "exit 1")
    if stopped.exit_code != 0:
        raise InfrastructureError("the runtime did not stop within 10 s of SIGTERM")
    host.get(HotPlug).remove(b.qdev_id)
    b.insert(b.other_serial())
    if not host.get(HotPlug).guest_has_device(b.bdf, timeout_s=20):
        raise InfrastructureError(f"the guest never showed {b.bdf} after the swap")
    guest_quiet(host)
    host.restart_runtime()
    runtime = host.runtime
    why = _await_flag(runtime, b, subscribe_from_start(runtime))
    if why:
        problems.append(f"case 4 (swapped while the runtime was down): {why}")
    flagged = _flagged(host)
    if flagged != [b.qdev_id]:
        problems.append(f"after case 4 the runtime flags {flagged}; only {b.qdev_id} changed "
                        "since it last ran")

    # 5. another unit after the runtime's own orderly removal
    wait_boot_self_checks(runtime)
    old_fingerprint = runtime.call("device", {"device": a.bdf})["fingerprint"]
    removed = a.remove_through_runtime(runtime)
    mark = runtime.mark()
    a.insert(a.other_serial())
    why = _await_flag(runtime, a, mark)
    record = runtime.call("device", {"device": a.bdf})
    if why:
        cause = removed["data"]["cause"]
        problems.append(f"case 5 (after the runtime's orderly removal, cause {cause!r}): {why}")
    if a.reported(record) != a.expected:
        problems.append(f"case 5: the replacement in {a.slot.name} is reported with serial "
                        f"{a.reported(record)!r}, its own is {a.expected!r}")
    if record["fingerprint"] == old_fingerprint:
        problems.append(f"case 5: the replacement in {a.slot.name} carries the removed unit's "
                        f"fingerprint {old_fingerprint}")

    assert not problems, "in-place identity changes:\n  " + "\n  ".join(problems)
