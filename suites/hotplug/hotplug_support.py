"""Helpers of the HP suite: slots, runtime procedure events, ground truth, budgets.

Every wait has a deadline. Ground truth is QEMU's own bus tree (QMP
`query-pci`), read here without the runtime's code. Procedure steps are the
runtime's `procedure` events (`procedure, run, device, entry, step, status,
ts_ns`, docs/protocol.md); `ts_ns` is the runtime's CLOCK_MONOTONIC, so step
durations are measured on the guest's clock, where the runtime keeps time.
"""

from __future__ import annotations

import pytest

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.floor_judgement import judge_interval_over_stalls  # noqa: F401 (HP-02/03 import it)
from hilconform.fixtures.host_protocol import (
    HotPlug,
    budget,  # noqa: F401 (the HP tests import it from here)
)
from hilconform.fixtures.runtime_client import RuntimeCallError
from hilconform.fixtures.runtime_waits import REMOVED_TIMEOUT_S, wait_self_check_end  # noqa: F401 (HP tests)
from hilconform.fixtures.runtime_waits import subscribe_live as subscribe  # noqa: F401 (for the HP tests)
from hilconform.fixtures.stall_witness import stalled_ms  # noqa: F401 (HP-02/03 import it)
from hilconform.fixtures.udev_settle import wait_udev_settled

HOT_ADD_END_TIMEOUT_S = 30.0  # device_add -> self-check end: ~0.5-2 s on TCG, steps retry up to 3 s each
DEVICE_DELETED_TIMEOUT_S = 20.0  # the runtime's slot power-off -> QEMU DEVICE_DELETED: ~1.1 s
# The runtime answers `remove` when its procedure ends: drain (<= 300 ms), maybe a reset
# (reset_timeout_ms 5 s, longer while a stuck nvme freezes the VM), power-off (<= 4 s).
REMOVE_CALL_TIMEOUT_S = 40.0

REMOVAL_ORDER = ("isolate", "drain", "deallocate", "topology", "power_off")
HOT_ADD_ORDER = ("link_active", "firmware", "mmio", "interrupts", "join_pool")


# -- profile ----------------------------------------------------------------------------------



def empty_slot(host):
    """The profile's first empty hot-plug slot; skips the test when it has none."""
    for slot in host.profile.slots:
        if not slot.populated:
            return slot
    pytest.skip(f"profile {host.profile.name} has no empty hot-plug slot")


def queue_slot(host):
    """A populated slot whose stand-in has a stallable queue; skips when there is none."""
    return host.profile.slot(host.targets("queue-stall")[0])


# -- ground truth -----------------------------------------------------------------------------

def expected_managed(host) -> set[str]:
    """BDFs of the endpoints QEMU has that the profile's selection names (query-pci)."""
    profile = host.profile
    ids = {i.lower() for i in profile.select_ids}
    out = set()
    for fn in host.ground_truth():
        if fn.secondary_bus is not None:
            continue  # a bridge / root port
        klass = f"{fn.class_code:04x}"
        if (fn.ids in ids or f"{fn.vendor_id:04x}:*" in ids
                or any(klass.startswith(c[:4].lower()) for c in profile.select_classes)):
            out.add(fn.bdf)
    return out


def inventory_mismatch(host) -> str | None:
    """None when the runtime's inventory lists exactly QEMU's managed endpoints."""
    inventory = host.runtime.call("inventory")
    listed = {d["device"] for d in inventory["devices"]}
    truth = expected_managed(host)
    if listed == truth:
        return None
    return (f"runtime inventory {sorted(listed)} != QEMU query-pci {sorted(truth)} "
            f"(runtime only: {sorted(listed - truth)}, QEMU only: {sorted(truth - listed)})")


# -- runtime events ---------------------------------------------------------------------------

def wait_procedure_end(runtime, bdf: str, procedure: str, after: int,
                       timeout_s: float) -> dict:
    return runtime.wait_event(
        "procedure", after, timeout_s,
        match=lambda d: d["device"] == bdf and d["procedure"] == procedure and d["step"] == "end",
        what=f"{procedure} of {bdf} ends")


def run_steps(runtime, after: int, run_id: str) -> list[dict]:
    """Every `procedure` event of one run, in the order received (= seq order), with seq."""
    return [{**e["data"], "seq": e["seq"], "host_ns": e["host_ns"]}
            for e in runtime.events(after, "procedure") if e["data"]["run"] == run_id]


def events_for(runtime, after: int, name: str, bdf: str) -> list[dict]:
    return [e for e in runtime.events(after, name) if e["data"].get("device") == bdf]


def first_step(steps: list[dict], name: str, statuses: tuple[str, ...] | None = None) -> dict | None:
    for step in steps:
        if step["step"] == name and (statuses is None or step["status"] in statuses):
            return step
    return None


def final_step(steps: list[dict], name: str) -> dict | None:
    """The step's outcome: its first event that is not the announcement of its start."""
    return next((s for s in steps if s["step"] == name and s["status"] != "started"), None)


def step_before(steps: list[dict], step: dict) -> dict:
    """The run's event just before `step` (a drain's own start, or the step it follows): the
    runtime-clock start of the interval `step` ends."""
    return max((s for s in steps if s["seq"] < step["seq"]), key=lambda s: s["seq"])


def describe_steps(steps: list[dict]) -> str:
    return ", ".join(f"{s['step']}:{s['status']}" for s in steps)


def check_in_order(steps: list[dict], order: tuple[str, ...]) -> list[str]:
    """Problems (empty when fine): each named step present once with a final status, in order,
    with a timestamp that does not go back."""
    problems = []
    final = [s for s in steps if s["status"] != "started"]
    found = []
    for name in order:
        matches = [s for s in final if s["step"] == name]
        if not matches:
            problems.append(f"step {name!r} missing")
            continue
        if len(matches) > 1:
            problems.append(f"step {name!r} reported {len(matches)} times")
        step = matches[0]
        if not isinstance(step.get("ts_ns"), int):
            problems.append(f"step {name!r} has no integer ts_ns: {step.get('ts_ns')!r}")
        found.append(step)
    for before, after in zip(found, found[1:], strict=False):
        if after["seq"] <= before["seq"]:
            problems.append(f"step {after['step']!r} (seq {after['seq']}) came before "
                            f"{before['step']!r} (seq {before['seq']})")
        elif isinstance(before.get("ts_ns"), int) and isinstance(after.get("ts_ns"), int) \
                and after["ts_ns"] < before["ts_ns"]:
            problems.append(f"step {after['step']!r} has ts_ns {after['ts_ns']} earlier than "
                            f"{before['step']!r} ({before['ts_ns']})")
    return problems


# -- hot-plug actions -------------------------------------------------------------------------

def hot_add_and_settle(host, slot_name: str) -> tuple[object, str, list[dict]]:
    """Hot-add a stand-in into an empty slot; wait for the runtime's self-check to end.

    Returns (the hot-add's record, BDF, the hot_add run's steps)."""
    runtime = host.runtime
    mark = subscribe(runtime)
    record = host.get("hot-add").hot_add(slot_name)
    bdf = record.bdf
    end = wait_procedure_end(runtime, bdf, "hot_add", mark, HOT_ADD_END_TIMEOUT_S)
    guest_udev_settle(host)
    return record, bdf, run_steps(runtime, mark, end["data"]["run"])


def guest_udev_settle(host, timeout_s: float = 20.0) -> None:
    """Wait until the guest's udev has handled every event (a new nvme's namespace is
    probed by udev's blkid: reads the removal's drain would otherwise find in flight)."""
    wait_udev_settled(host, timeout_s)


def watch_departures(host):
    """Started before a removal the test does not make itself (the runtime's orderly removal, a
    slot powered off in the guest): `wait_departed` then says when the device left the host."""
    return host.get(HotPlug).departures()


def wait_departed(departures, bdf: str, timeout_s: float = DEVICE_DELETED_TIMEOUT_S) -> int | None:
    """When the host saw the device leave (host_ns: this controller's monotonic clock), or None
    by the deadline."""
    return departures.wait_gone(bdf, timeout_s)

def ensure_slot_empty(host, slot_name: str) -> None:
    """Clean-up for the shared host: take out whatever a failed test left in the slot."""
    device = host.slot_device(slot_name)
    if device is not None and device.qdev_id:
        host.get(HotPlug).remove(device.qdev_id)


def allocate(runtime, bdf: str, holder: str) -> dict:
    try:
        return runtime.call("allocate", {"device": bdf, "holder": holder})
    except RuntimeCallError as exc:
        raise AssertionError(f"allocate {bdf} refused before the test could start: {exc}") from None


def settled_record(host, bdf: str, timeout_s: float = HOT_ADD_END_TIMEOUT_S) -> dict:
    """The device's record once its self-check (boot or hot-add) has ended."""
    runtime = host.runtime
    host.settled_inventory()
    record = runtime.call("device", {"device": bdf})
    if record["busy"] == "hot_add":
        mark = runtime.mark()
        runtime.call("subscribe", {"since_seq": 0})  # replays the history: an end already sent counts
        wait_self_check_end(runtime, bdf, mark, timeout_s)
        record = runtime.call("device", {"device": bdf})
    return record


def pull_slot_power(host, bdf: str) -> None:
    """Power off the hot-plug slot holding `bdf` from the guest kernel (not the runtime)."""
    bus = bdf.rsplit(".", 1)[0]  # 0000:01:00
    script = (f"for s in /sys/bus/pci/slots/*; do [ \"$(cat $s/address 2>/dev/null)\" = {bus} ] "
              "&& echo $s && echo 0 > $s/power && exit 0; done; exit 3")
    result = host.shell(script, timeout_s=30)
    if result.exit_code != 0:
        raise InfrastructureError(f"could not power off the slot of {bdf} in the guest: exit "
                                  f"{result.exit_code} {result.stdout.strip()} {result.stderr.strip()}")

