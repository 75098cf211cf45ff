"""LIFE-06: any sequence of allocate, renew, release, AER, hot-add, hot-remove and reset never
yields an illegal transition, a lost or duplicated device, a double allocation, or a
runtime crash.

A hypothesis RuleBasedStateMachine drives one fresh emulated host (native hot-plug;
QMP for hot-add, device_del and AER injection; the runtime protocol for the rest). The
VM is not restarted between examples: each example starts from whatever the previous
one left (its leases are released at teardown), which is itself part of "any sequence".
Every rule waits, with a deadline, until the runtime has finished what it started
(self-checks, procedures, AER recovery). After every step the invariants hold:

* transitions: every `transition` event since boot passes the checker
  (fixtures/transition_checker.py) against the published table;
* devices: the runtime's inventory lists exactly the functions QEMU emulates that the
  profile's selector names (`query-pci`), each once, with distinct fingerprints;
* allocation: no device in two leases, the inventory's lease fields agree with
  `leases`, the lease events never grant a held device, and the leases are exactly
  those the model holds (a lease only loses a device with a `deallocate` to its holder);
* serving: `hello` and `stats` answer, the runtime's pid is the one it started with,
  it reports no internal error and the client saw no protocol violation.

Profiles: CI (default) max_examples=5, stateful_step_count=10; nightly
(HILCONFORM_NIGHTLY=1) max_examples=20, stateful_step_count=25. The seed is random
unless HILCONFORM_LIFE06_SEED is set; it is printed, recorded as a JUnit property and
attached to the report with the settings and the steps run, so a failure can be
replayed with HILCONFORM_LIFE06_SEED=<seed> (hypothesis also prints the failing steps
and a @reproduce_failure blob). Shrinking is off: a live VM does not replay exactly.
"""

from __future__ import annotations

import functools
import os
import random
import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from lifecycle_support import (
    HOT_ADD_TIMEOUT_S,
    PROCEDURE_TIMEOUT_S,
    LeaseLedger,
    assert_leases_consistent,
    empty_slots,
    flush,
    inject_nonfatal,
    kind_ids,
    managed_truth,
    remove_and_wait_gone,
    settled_inventory,
    slot_of,
    subscribe_from_start,
)

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.runtime_client import RuntimeCallError

pytestmark = [pytest.mark.clause("LIFE-06"), pytest.mark.destructive, pytest.mark.slow]

PROFILES = {
    "ci": {"max_examples": 5, "stateful_step_count": 10},
    "nightly": {"max_examples": 20, "stateful_step_count": 25},
}
HOLDERS = ("life06-alice", "life06-bob")
LEASE_TTL_S = 3600  # expiry is LIFE-04's business: a lease here ends only by our hand or a revocation
PICK = st.integers(min_value=0, max_value=1 << 16)


def life06_settings() -> tuple[str, settings]:
    profile = "nightly" if os.environ.get("HILCONFORM_NIGHTLY") == "1" else "ci"
    return profile, settings(
        deadline=None, database=None, phases=[Phase.generate], print_blob=True,
        report_multiple_bugs=False, suppress_health_check=list(HealthCheck), **PROFILES[profile])


class Rig:
    """The live system the machine drives, and what persists across examples."""

    def __init__(self, host):
        self.host = host
        self.runtime = host.runtime
        self.checker, self.mark = subscribe_from_start(self.runtime)
        self.ledger = LeaseLedger()
        self.hello = self.runtime.call("hello", {"client": "life06"})
        self.resubscribe()
        self.internal_errors = self.runtime.call("stats")["internal_errors"]
        self.model_seen: set[int] = set()  # seqs of deallocate events applied to the model
        self.steps: list[str] = []
        self.failures: list[str] = []
        self.first_error: Exception | None = None  # the exception behind failures[0]
        self.started = time.monotonic()
        # class allocations ask for the stand-in kind of the first slot (nvme on a100/t4)
        self.class_ids = kind_ids(host.profile.kind(host.profile.slots[0].accepts))

    def log(self, text: str) -> None:
        self.steps.append(f"{time.monotonic() - self.started:7.1f}s {text}")

    def last_seq(self) -> int:
        return max((e["seq"] for e in self.runtime.events(self.mark)), default=0)

    def resubscribe(self) -> None:
        """`hello` starts a fresh session on virtio-serial: subscribe again, replaying what
        was emitted since the last event received (the checkers drop duplicates)."""
        self.runtime.call("subscribe", {"since_seq": self.last_seq()})

    def settle(self) -> dict:
        inventory = settled_inventory(self.runtime)
        flush(self.runtime)
        return inventory


@pytest.mark.needs("hot-add", "orderly-removal", "aer-nonfatal", "reset", "qmp")
def test_random_operation_sequences_keep_every_invariant(host, request, record_property):
    profile, chosen = life06_settings()
    seed = int(os.environ.get("HILCONFORM_LIFE06_SEED") or random.SystemRandom().randrange(1 << 32))
    banner = (f"LIFE-06 hypothesis profile {profile}: max_examples={chosen.max_examples}, "
              f"stateful_step_count={chosen.stateful_step_count}, seed={seed} "
              f"(replay: HILCONFORM_LIFE06_SEED={seed}"
              f"{' HILCONFORM_NIGHTLY=1' if profile == 'nightly' else ''})")
    print(banner)
    record_property("life06_seed", seed)
    record_property("life06_profile", profile)
    request.node.add_report_section("call", "LIFE-06 hypothesis", banner)
    rig = Rig(host)
    rig.settle()

    def recorded(function):
        """Keep the first failure: on a live VM hypothesis's replay of a failing example
        does not retrace it, and its report (Flaky...) would hide the real one."""
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except Exception as exc:
                if not rig.failures:
                    rig.failures.append(f"{function.__name__}: {type(exc).__name__}: {exc}")
                    rig.first_error = exc
                raise
        return wrapper

    class LifecycleMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.leases: dict[str, dict] = {}  # lease id -> {"holder", "devices": set}
            self.ended: list[str] = []  # lease ids that no longer exist
            self.present: list[str] = []  # managed BDFs, sorted
            self.empty: list[str] = []  # slots with nothing in them

        # -- model upkeep ---------------------------------------------------------------------
        def refresh(self) -> dict:
            inventory = rig.settle()
            self.present = sorted(d["device"] for d in inventory["devices"])
            self.empty = empty_slots(rig.host)
            self.apply_deallocations()
            return inventory

        def apply_deallocations(self) -> None:
            for event in rig.runtime.events(rig.mark, "deallocate"):
                if event["seq"] in rig.model_seen:
                    continue
                rig.model_seen.add(event["seq"])
                lease = self.leases.get(event["data"]["lease"])
                if lease is None:
                    continue
                lease["devices"].discard(event["data"]["device"])
                if not lease["devices"]:
                    self.ended.append(event["data"]["lease"])
                    del self.leases[event["data"]["lease"]]

        def nothing_to_do(self, rule_name: str, why: str) -> None:
            # Rules stay enabled whatever the VM's state (no preconditions on live state:
            # hypothesis needs the same choices to draw the same data); they no-op instead.
            rig.log(f"{rule_name}: nothing to do ({why})")

        def device(self, pick: int) -> str:
            return self.present[pick % len(self.present)]

        def record(self, bdf: str) -> dict:
            return rig.runtime.call("device", {"device": bdf})

        # -- lifecycle of an example ----------------------------------------------------------
        @initialize()
        @recorded
        def start_from_the_live_state(self):
            rig.log("example starts")
            self.refresh()
            for lease in rig.runtime.call("leases")["leases"]:
                assert lease["holder"] not in HOLDERS, f"a lease outlived its example: {lease}"

        def teardown(self):
            for lease_id in list(self.leases):
                try:
                    rig.runtime.call("release", {"lease": lease_id})
                except RuntimeCallError as exc:
                    rig.log(f"teardown release {lease_id}: {exc.code}")
            self.leases.clear()
            try:
                rig.settle()
            except AssertionError as exc:  # reported by the next example's invariants
                rig.log(f"teardown settle: {exc}")

        # -- rules ----------------------------------------------------------------------------
        @rule(pick=PICK, holder=st.sampled_from(HOLDERS))
        @recorded
        def allocate_device(self, pick, holder):
            if not self.present:
                return self.nothing_to_do("allocate_device", "no device")
            bdf = self.device(pick)
            before = self.record(bdf)
            rig.log(f"allocate {bdf} ({before['state']}, lease {before['lease']}) for {holder}")
            try:
                lease = rig.runtime.call("allocate", {"device": bdf, "holder": holder, "ttl_s": LEASE_TTL_S})
            except RuntimeCallError as exc:
                expected = ("DEVICE_BUSY" if before["lease"] else
                            "NOT_HEALTHY" if not before["in_pool"] else None)
                assert exc.code == expected, (
                    f"allocate {bdf} ({before['state']}): {exc!r}, expected {expected}")
            else:
                assert before["in_pool"] and before["lease"] is None, (
                    f"{bdf} was allocated while {before['state']}, in_pool={before['in_pool']}, "
                    f"lease {before['lease']}")
                self.leases[lease["lease"]] = {"holder": holder, "devices": set(lease["devices"])}
            self.refresh()

        @rule(count=st.integers(min_value=1, max_value=3), holder=st.sampled_from(HOLDERS))
        @recorded
        def allocate_class(self, count, holder):
            inventory = rig.runtime.call("inventory")["devices"]
            free = {d["device"] for d in inventory if d["in_pool"] and d["lease"] is None
                    and f"{d['info']['vendor_id']}:{d['info']['device_id']}" == rig.class_ids}
            rig.log(f"allocate {count} of {rig.class_ids} for {holder} ({len(free)} free)")
            try:
                lease = rig.runtime.call("allocate", {"class": rig.class_ids, "count": count,
                                                      "holder": holder, "ttl_s": LEASE_TTL_S})
            except RuntimeCallError as exc:
                assert exc.code == "INSUFFICIENT_DEVICES" and count > len(free), (
                    f"allocate {count} of {len(free)} free: {exc!r}")
            else:
                got = set(lease["devices"])
                assert len(got) == count == len(lease["devices"]) and got <= free, (
                    f"asked {count} of the free {sorted(free)}, got {lease['devices']}")
                self.leases[lease["lease"]] = {"holder": holder, "devices": got}
            self.refresh()

        @rule(pick=PICK)
        @recorded
        def renew(self, pick):
            if not self.leases:
                return self.nothing_to_do("renew", "no lease")
            lease_id = sorted(self.leases)[pick % len(self.leases)]
            rig.log(f"renew {lease_id}")
            lease = rig.runtime.call("renew", {"lease": lease_id})
            assert set(lease["devices"]) == self.leases[lease_id]["devices"], (lease, self.leases[lease_id])
            self.refresh()

        @rule(pick=PICK)
        @recorded
        def renew_an_ended_lease(self, pick):
            if not self.ended:
                return self.nothing_to_do("renew_an_ended_lease", "no ended lease")
            lease_id = self.ended[pick % len(self.ended)]
            rig.log(f"renew ended {lease_id}")
            with pytest.raises(RuntimeCallError) as info:
                rig.runtime.call("renew", {"lease": lease_id})
            assert info.value.code == "UNKNOWN_LEASE", info.value

        @rule(pick=PICK)
        @recorded
        def release(self, pick):
            if not self.leases:
                return self.nothing_to_do("release", "no lease")
            lease_id = sorted(self.leases)[pick % len(self.leases)]
            rig.log(f"release {lease_id} {sorted(self.leases[lease_id]['devices'])}")
            result = rig.runtime.call("release", {"lease": lease_id})
            assert result.get("released") is True, result
            del self.leases[lease_id]
            self.ended.append(lease_id)
            self.refresh()

        @rule(pick=PICK)
        @recorded
        def aer_nonfatal(self, pick):
            if not self.present:
                return self.nothing_to_do("aer_nonfatal", "no device")
            bdf = self.device(pick)
            slot = slot_of(rig.host, bdf)
            rig.log(f"AER non-fatal at {slot} ({bdf}, {self.record(bdf)['state']})")
            inject_nonfatal(rig.host, slot, bdf)
            self.refresh()

        @rule(pick=PICK)
        @recorded
        def hot_add(self, pick):
            if not self.empty:
                return self.nothing_to_do("hot_add", "no empty slot")
            slot = self.empty[pick % len(self.empty)]
            mark = rig.runtime.mark()
            added = rig.host.get("hot-add").hot_add(slot)
            rig.log(f"hot-add {rig.host.profile.slot(slot).accepts} into {slot} ({added.bdf})")
            rig.runtime.wait_event(
                "procedure", mark, HOT_ADD_TIMEOUT_S, what=f"end of the self-check of {added.bdf}",
                match=lambda d: (d["device"], d["procedure"], d["step"]) == (added.bdf, "hot_add", "end"))
            inventory = self.refresh()
            assert added.bdf in {d["device"] for d in inventory["devices"]}, f"{added.bdf} not listed"

        @rule(pick=PICK)
        @recorded
        def remove_by_protocol(self, pick):
            if not self.present:
                return self.nothing_to_do("remove_by_protocol", "no device")
            bdf = self.device(pick)
            qdev = managed_truth(rig.host)[bdf]
            rig.log(f"protocol remove {bdf} ({qdev}, {self.record(bdf)['state']})")
            remove_and_wait_gone(rig.host, rig.runtime, bdf)
            self.refresh()

        @rule(pick=PICK)
        @recorded
        def remove_by_device_del(self, pick):
            if not self.present:
                return self.nothing_to_do("remove_by_device_del", "no device")
            bdf = self.device(pick)
            slot = slot_of(rig.host, bdf)
            rig.log(f"device_del in {slot} ({bdf}, {self.record(bdf)['state']})")
            mark = rig.runtime.mark()
            rig.host.get("orderly-removal").remove(slot)
            rig.runtime.wait_event("removed", mark, 20, match=lambda d: d["device"] == bdf,
                                   what=f"removal of {bdf}")
            self.refresh()

        @rule(pick=PICK, force=st.booleans())
        @recorded
        def reset(self, pick, force):
            if not self.present:
                return self.nothing_to_do("reset", "no device")
            bdf = self.device(pick)
            before = self.record(bdf)
            rig.log(f"reset {bdf} force={force} ({before['state']}, lease {before['lease']})")
            try:
                result = rig.runtime.call("reset", {"device": bdf, "force": force},
                                          timeout_s=PROCEDURE_TIMEOUT_S)
            except RuntimeCallError as exc:
                assert exc.code == "DEVICE_BUSY" and before["lease"] and not force, (
                    f"reset {bdf} (lease {before['lease']}, force={force}): {exc!r}")
            else:
                assert not before["lease"] or force, f"reset of held {bdf} without force was run"
                assert result["outcome"] == "ok", f"reset of {bdf}: {result}"
            self.refresh()

        @rule(pick=PICK)
        @recorded
        def recover(self, pick):
            if not self.present:
                return self.nothing_to_do("recover", "no device")
            bdf = self.device(pick)
            before = self.record(bdf)
            rig.log(f"recover {bdf} ({before['state']})")
            try:
                result = rig.runtime.call("recover", {"device": bdf}, timeout_s=PROCEDURE_TIMEOUT_S)
            except RuntimeCallError as exc:
                assert exc.code == "INVALID_STATE" and before["state"] not in ("DEGRADED", "FAULTED"), (
                    f"recover {bdf} ({before['state']}): {exc!r}")
            else:
                assert before["state"] in ("DEGRADED", "FAULTED"), f"recover ran on {before['state']} {bdf}"
                assert result.get("recovered") is True or result.get("failed_step"), (
                    f"recover of {bdf}: neither recovered nor a failed step named: {result}")
            self.refresh()

        # -- invariants -----------------------------------------------------------------------
        @invariant()
        @recorded
        def only_legal_transitions(self):
            flush(rig.runtime)
            rig.checker.feed_all(rig.runtime.events(rig.mark))
            rig.checker.assert_clean(finished=False)

        @invariant()
        @recorded
        def no_lost_or_duplicated_device(self):
            listed = [d["device"] for d in rig.runtime.call("inventory")["devices"]]
            truth = managed_truth(rig.host)
            assert len(listed) == len(set(listed)), f"a device is listed twice: {listed}"
            assert set(listed) == set(truth), (
                f"lost: {sorted(set(truth) - set(listed))}; not in QEMU: {sorted(set(listed) - set(truth))}")
            fingerprints = [d["fingerprint"] for d in rig.runtime.call("inventory")["devices"]]
            assert len(fingerprints) == len(set(fingerprints)), f"duplicate fingerprints: {fingerprints}"

        @invariant()
        @recorded
        def no_double_allocation(self):
            for attempt in range(3):  # a revocation racing the snapshot: look again
                flush(rig.runtime)
                self.apply_deallocations()
                held = assert_leases_consistent(rig.runtime)
                runtime_leases = {x["lease"]: set(x["devices"]) for x in rig.runtime.call("leases")["leases"]}
                model = {lease_id: lease["devices"] for lease_id, lease in self.leases.items()}
                if runtime_leases == model or attempt == 2:
                    break
            assert runtime_leases == model, f"runtime leases {runtime_leases}, the model holds {model}"
            assert set(held) == {d for devices in model.values() for d in devices}
            rig.ledger.feed_all(rig.runtime.events(rig.mark))
            rig.ledger.assert_clean()

        @invariant()
        @recorded
        def runtime_keeps_serving(self):
            hello = rig.runtime.call("hello", {"client": "life06"})
            rig.resubscribe()
            assert hello["pid"] == rig.hello["pid"] and hello["started_ns"] == rig.hello["started_ns"], (
                f"the runtime restarted: {rig.hello['pid']} -> {hello['pid']}")
            stats = rig.runtime.call("stats")
            assert stats["internal_errors"] == rig.internal_errors, (
                f"the runtime hit {stats['internal_errors'] - rig.internal_errors} internal error(s)")
            assert rig.runtime.violations == [], rig.runtime.violations

    try:
        run_state_machine_as_test(hypothesis_seed(seed)(LifecycleMachine), settings=chosen)
    except Exception as exc:
        if not rig.failures:
            raise
        steps = "\n  ".join(rig.steps[-40:])
        report = f"{banner}\nfirst failure: {rig.failures[0]}\nlast steps:\n  {steps}"
        if isinstance(rig.first_error, InfrastructureError):  # the test bed failed, not the runtime
            raise InfrastructureError(report) from rig.first_error
        raise AssertionError(report) from exc
    else:
        flush(rig.runtime)
        rig.checker.feed_all(rig.runtime.events(rig.mark))
        rig.checker.assert_clean()  # finished: a combined main move still owed is a violation
    finally:
        request.node.add_report_section("call", "LIFE-06 steps", "\n".join(rig.steps))
        request.node.add_report_section("call", "LIFE-06 transitions", rig.checker.summary())
        print(f"{banner}: {len(rig.steps)} steps")
