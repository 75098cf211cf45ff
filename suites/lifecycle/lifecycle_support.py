"""Helpers shared by the LIFE suite: subscriptions, waits with deadlines, AER injection,
runtime configurations with a changed policy, the ground truth of managed devices and a
ledger of lease events (never two holders).

Waits are on runtime events with a deadline; a state the runtime never reaches is the
runtime's failure (`RuntimeUnresponsive`, an AssertionError), while trouble with the
test bed (QEMU, the guest agent, a fault QEMU refused) stays an `InfrastructureError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from hilconform.fixtures import runtime_waits
from hilconform.fixtures.errors import InfrastructureError, WaitTimeout
from hilconform.fixtures.host_protocol import HotPlug
from hilconform.fixtures.runtime_client import RuntimeCallError, RuntimeUnresponsive
from hilconform.fixtures.transition_checker import TransitionChecker

SETTLE_TIMEOUT_S = 60.0  # boot self-checks of every device (TCG, a loaded machine)
AER_TIMEOUT_S = 20.0  # injection -> the runtime's `recovered` event
HOT_ADD_TIMEOUT_S = 30.0  # device_add -> the end of the runtime's hot-add self-check
PROCEDURE_TIMEOUT_S = 30.0  # remove / reset / recover replies
WAKE_TICK_S = 0.5  # a wait_until re-checks at least this often while no event comes

# Policies used by the AER tests: (almost) no decay during a test (half-life of an hour)
# and no AER-driven reset, so the state after N errors follows from the thresholds alone.
# The weight still decays a little (N errors weigh just under N), so thresholds sit
# half-way: `threshold(2)` is crossed by the second error, not by the first.
STEADY_AER = {"half_life_s": 3600.0, "reset_weight": 1000.0}


def threshold(errors: int) -> float:
    """An error-weight threshold that the `errors`-th non-fatal error (weight 1) crosses."""
    return errors - 0.5


# -- subscriptions and checkers -----------------------------------------------------------------

def subscribe_from_start(runtime) -> tuple[TransitionChecker, int]:
    """Subscribe with replay of the runtime's retained history.

    Returns a checker (complete_history when the replay starts at the runtime's first
    event) and the client mark before the replay: feed it `runtime.events(mark)`.
    """
    mark = runtime.mark()
    reply = runtime.call("subscribe", {"since_seq": 0})
    complete = reply["history_starts_at"] <= 1
    return TransitionChecker(runtime.call("transitions"), complete_history=complete), mark


def subscribe_live(runtime) -> tuple[TransitionChecker, int]:
    """Make sure the client is subscribed (live events); a checker for what follows the mark."""
    mark = runtime_waits.subscribe_live(runtime)
    return TransitionChecker(runtime.call("transitions"), complete_history=False), mark


def flush(runtime) -> None:
    """A round trip: every event the runtime emitted before answering is now in the log."""
    runtime.call("stats")


def transitions_of(runtime, mark: int, device: str | None = None) -> list[dict]:
    found = [e for e in runtime.events(mark, "transition")]
    found.sort(key=lambda e: e["seq"])
    unique = {e["seq"]: e for e in found}
    return [e for e in unique.values() if device is None or e["data"]["device"] == device]


def health_moves(runtime, mark: int, device: str) -> list[tuple[str, str]]:
    return [(e["data"]["from"], e["data"]["to"]) for e in transitions_of(runtime, mark, device)
            if e["data"]["view"] == "health"]


# -- waits ----------------------------------------------------------------------------------------

def wait_until(runtime, probe: Callable[[], Any], timeout_s: float, what: str,
               wake_on: str = "transition") -> Any:
    """Call `probe` until it returns something truthy, re-checking whenever a `wake_on`
    event arrives (and at least every WAKE_TICK_S); fail the runtime at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        mark = runtime.mark()
        result = probe()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeUnresponsive(f"{what}: not reached within {timeout_s:.0f}s")
        try:
            runtime.wait_event(wake_on, mark, min(remaining, WAKE_TICK_S))
        except RuntimeUnresponsive:
            pass


def quiet(record: dict) -> bool:
    """No procedure running, not DISCOVERED, no AER recovery open: a state a test may judge."""
    return (record["state"] != "DISCOVERED" and record["busy"] is None
            and not record.get("aer", {}).get("recovering"))


def free_devices(host, runtime, needed: int) -> list[str]:
    """Pool devices without a lease; skips (with why) a host that manages fewer than `needed`.

    A host with too few devices cannot run the check (a one-GPU lab machine); a host with
    enough devices of which too few are free is a finding, left to the caller's assert.
    """
    import pytest

    devices = settled_inventory(runtime)["devices"]
    if len(devices) < needed:
        pytest.skip(f"host {host.description} manages {len(devices)} device(s); this check needs {needed}")
    return [d["device"] for d in devices if d["in_pool"] and d["lease"] is None]


def settled_inventory(runtime, timeout_s: float = SETTLE_TIMEOUT_S) -> dict:
    """The inventory once cold discovery ended and no device is in a self-check or procedure."""
    def probe():
        inventory = runtime.call("inventory")
        if inventory["complete"] and all(quiet(d) for d in inventory["devices"]):
            return inventory
        return None
    return wait_until(runtime, probe, timeout_s, "every device through its self-check, no procedure "
                      "running", wake_on="procedure")


def device_record(runtime, bdf: str) -> dict:
    return runtime.call("device", {"device": bdf})


def wait_state(runtime, bdf: str, states: Iterable[str], timeout_s: float = PROCEDURE_TIMEOUT_S) -> dict:
    wanted = set(states)

    def probe():
        record = device_record(runtime, bdf)
        return record if record["state"] in wanted and quiet(record) else None
    return wait_until(runtime, probe, timeout_s, f"{bdf} in {sorted(wanted)}")


def wait_procedure_end(runtime, mark: int, procedure: str, bdf: str,
                       timeout_s: float = HOT_ADD_TIMEOUT_S) -> dict:
    event = runtime.wait_event(
        "procedure", mark, timeout_s,
        match=lambda d: d["procedure"] == procedure and d["device"] == bdf and d["step"] == "end",
        what=f"end of {procedure} on {bdf}")
    flush(runtime)
    return event


def procedure_run(runtime, mark: int, procedure: str, bdf: str) -> list[dict]:
    """The step events of the first `procedure` run on `bdf` after the mark, in seq order."""
    steps = [e for e in runtime.events(mark, "procedure")
             if e["data"]["procedure"] == procedure and e["data"]["device"] == bdf]
    steps.sort(key=lambda e: e["seq"])
    if not steps:
        return []
    run = steps[0]["data"]["run"]
    return [e for e in steps if e["data"]["run"] == run]


def allocate(runtime, **params) -> dict:
    return runtime.call("allocate", params)


def refused(call: Callable[[], Any]) -> RuntimeCallError | None:
    """The error a call was refused with, or None when it succeeded (its result is dropped)."""
    try:
        call()
    except RuntimeCallError as exc:
        return exc
    return None


# -- faults ---------------------------------------------------------------------------------------

def remove_and_wait_gone(host, runtime, bdf: str, timeout_s: float = 20.0) -> dict:
    """The runtime's orderly removal of `bdf` (protocol `remove`, which must succeed), and the
    device gone from the host; the runtime's answer. A device still there by the deadline is the
    test bed's WaitTimeout."""
    departures = host.get(HotPlug).departures()
    result = runtime.call("remove", {"device": bdf}, timeout_s=PROCEDURE_TIMEOUT_S)
    assert result.get("ok") is True, f"orderly removal of {bdf} failed: {result}"
    if departures.wait_gone(bdf, timeout_s) is None:
        raise WaitTimeout(f"{bdf} still on the host {timeout_s:.0f}s after its orderly removal")
    return result


def inject_nonfatal(host, slot: str, bdf: str, timeout_s: float = AER_TIMEOUT_S) -> dict:
    """An uncorrectable non-fatal error at the slot's root port (verified by the guest's
    counters); returns the runtime's `recovered`/`recovery_failed` event for `bdf`, with
    every transition it caused already received."""
    runtime = host.runtime
    mark = runtime.mark()
    host.get("aer-nonfatal").aer_nonfatal(slot)
    event = runtime.wait_event(
        "aer", mark, timeout_s,
        match=lambda d: d["device"] == bdf and d["kind"] in ("recovered", "recovery_failed"),
        what=f"AER recovery of {bdf} after a non-fatal error at {slot}'s port")
    flush(runtime)
    return event


def slot_of(host, bdf: str) -> str:
    """The profile slot whose root port has `bdf` below it."""
    functions = host.ground_truth()
    bus = int(bdf.split(":")[1], 16)
    port = next((f for f in functions if f.secondary_bus == bus), None)
    for slot in host.profile.slots:
        if port is not None and slot.port_id == port.qdev_id:
            return slot.name
    raise InfrastructureError(f"no slot of host {host.profile.name} holds {bdf}")


def managed_truth(host) -> dict[str, str]:
    """BDF -> QEMU id of every function QEMU emulates that the profile's selector names."""
    return host.managed_truth()


def empty_slots(host) -> list[str]:
    occupied = set()
    functions = host.ground_truth()
    for slot in host.profile.slots:
        port = next((f for f in functions if f.qdev_id == slot.port_id), None)
        if port is None:
            raise InfrastructureError(f"root port {slot.port_id} not found in QEMU")
        if any(f.bdf.startswith(f"0000:{port.secondary_bus:02x}:") for f in functions):
            occupied.add(slot.name)
    return [s.name for s in host.profile.slots if s.name not in occupied]


def kind_ids(kind) -> str:
    return f"{kind.vendor}:{kind.device}"


def boot_ids(profile) -> set[str]:
    """IDs of the stand-ins the profile cold-plugs."""
    return {kind_ids(profile.kind(s.device)) for s in profile.slots if s.populated}


def foreign_kind(profile):
    """A stand-in kind without a queue backend (hot-addable into any slot) that no boot
    device is: a firmware rule on its IDs fails a hot-added device and no other."""
    for name in sorted(profile.kinds):
        kind = profile.kinds[name]
        if kind.queue == "none" and kind_ids(kind) not in boot_ids(profile) and selects(profile, kind):
            return kind
    return None


MISMATCHED_FIRMWARE = "0.0.1"  # what a hot-added failing model's firmware register reports


@dataclass(frozen=True)
class FailingAdd:
    """How a host hot-adds a device that fails its self-check at the firmware step.

    Stock hosts: a stand-in kind no boot device is, and a runtime config that expects
    firmware 9.9 for its IDs (`config`). Device-model hosts: the model the empty slot
    accepts, its firmware register armed to MISMATCHED_FIRMWARE before it appears, under
    the host's own config (so it shares its IDs with the healthy boot devices).
    """

    kind: Any  # a profile's device kind (profile.kind(name))
    config: dict
    armed: bool = False  # the unit arrives with its firmware armed (slot capability firmware-mismatch)

    @property
    def ids(self) -> str:
        return kind_ids(self.kind)

    def add(self, host, slot: str) -> str:
        """Hot-add the failing device into the empty `slot`; its BDF."""
        if self.armed:
            armed = host.get("firmware-mismatch").hot_add_with_firmware(slot, MISMATCHED_FIRMWARE)
            return armed.details["bdf"]
        return host.get("hot-add").hot_add(slot, kind=self.kind.name).bdf


def failing_add(host_factory) -> FailingAdd | None:
    """The way the factory's profile hot-adds a device that fails its self-check (None: it has
    none): where every empty slot offers `firmware-mismatch`, a unit armed with the wrong
    firmware; else a foreign stand-in kind and a firmware rule on its IDs."""
    profile = host_factory.profile
    empty = [s for s in profile.slots if not s.populated]
    if empty and all("firmware-mismatch" in host_factory.slot_capabilities(s.name) for s in empty):
        return FailingAdd(profile.kind(empty[0].accepts), {}, armed=True)
    kind = foreign_kind(profile)
    return None if kind is None else FailingAdd(kind, firmware_mismatch(kind_ids(kind)))


def selects(profile, kind) -> bool:
    """Whether the profile's runtime selection manages devices of this kind (by IDs or class)."""
    ids = {i.lower() for i in profile.select_ids}
    return (kind_ids(kind) in ids or f"{kind.vendor}:*" in ids
            or any(kind.class_code.lower().startswith(c.lower()[:4]) for c in profile.select_classes))


def firmware_mismatch(ids: str) -> dict:
    """Config changes: the runtime expects firmware 9.9 for `ids`, the stand-in reports 1.0."""
    return {"firmware": {ids: "9.9"}, "hooks": {"firmware": {ids: "1.0"}}}


def require_aer_recovery(record: dict) -> None:
    """Skip when the kernel cannot recover the device from a non-fatal error (no driver
    with error handlers: recovery fails and the device is FAULTED, AER-01/02's subject)."""
    if record["info"].get("driver") is None:
        pytest.skip(f"{record['device']} has no driver bound: the kernel cannot recover it from an "
                    f"AER error, so recovered-error policies do not apply")


def require_empty_slot(host) -> list[str]:
    empty = empty_slots(host)
    if not empty:
        pytest.skip(f"profile {host.profile.name} has no empty hot-plug slot")
    return empty


# -- runtime configurations -----------------------------------------------------------------------

def runtime_config(host_factory, changes: dict) -> str:
    """The runtime TOML the factory's emulated hosts would get for their profile, with `changes`
    merged in table by table (e.g. {"aer": {"fault_weight": 4.0}, "firmware": {"1234:11e8": "9.9"}})."""
    return host_factory.runtime_config(changes=changes)


# -- leases ---------------------------------------------------------------------------------------

class LeaseLedger:
    """Replays `lease` events: a device granted while another lease holds it is a violation."""

    def __init__(self) -> None:
        self.holder_of: dict[str, str] = {}  # device -> lease id
        self.violations: list[str] = []
        self._seen: set[int] = set()

    def feed_all(self, events: Iterable[dict]) -> None:
        for event in sorted((e for e in events if e["event"] == "lease"), key=lambda e: e["seq"]):
            if event["seq"] in self._seen:
                continue
            self._seen.add(event["seq"])
            self.feed(event["data"], event["seq"])

    def feed(self, lease: dict, seq: int) -> None:
        action, lease_id = lease["action"], lease["lease"]
        if action == "granted":
            for device in lease["devices"]:
                other = self.holder_of.get(device)
                if other is not None and other != lease_id:
                    self.violations.append(f"seq {seq}: {device} granted to {lease_id} "
                                           f"({lease['holder']}) while {other} holds it")
                self.holder_of[device] = lease_id
        elif action in ("released", "expired"):
            for device in lease["devices"]:
                if self.holder_of.get(device) == lease_id:
                    del self.holder_of[device]
        elif action == "revoked":
            if self.holder_of.get(lease.get("device")) == lease_id:
                del self.holder_of[lease["device"]]

    def assert_clean(self) -> None:
        assert not self.violations, "double allocation:\n  " + "\n  ".join(self.violations)


def assert_leases_consistent(runtime) -> dict:
    """No device in two leases; the inventory's lease fields agree with `leases`; a leased
    device is ALLOCATED and an ALLOCATED device is leased. Returns {device: lease}.

    `leases` is read before and after the inventory; when the two differ (a revocation
    raced the snapshot) the check looks again, at most three times.
    """
    for _ in range(3):
        leases = runtime.call("leases")["leases"]
        inventory = runtime.call("inventory")["devices"]
        if runtime.call("leases")["leases"] == leases:
            break
    held: dict[str, str] = {}
    problems = []
    for lease in leases:
        for device in lease["devices"]:
            if device in held:
                problems.append(f"{device} is in lease {held[device]} and in lease {lease['lease']}")
            held[device] = lease["lease"]
    for record in inventory:
        bdf = record["device"]
        if record["lease"] != held.get(bdf):
            problems.append(f"{bdf}: inventory says lease {record['lease']}, leases says {held.get(bdf)}")
        if (record["state"] == "ALLOCATED") != (bdf in held):
            problems.append(f"{bdf} is {record['state']} while {'held' if bdf in held else 'not held'}")
    assert not problems, "lease table inconsistent:\n  " + "\n  ".join(problems)
    return held
