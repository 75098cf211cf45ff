"""LIFE-03: allocate/release goes HEALTHY -> ALLOCATED -> RELEASED -> HEALTHY; allocating a
device that is not HEALTHY is refused with a clear error; no device is ever held by two
allocations.

* The cycle runs on the shared host (and leaves it as found): the transitions, the
  inventory's lease fields and the `leases` table at each stage.
* Holders race: one thread per holder, all released at once by a barrier, ask for the
  same device (exactly one lease, every other answer DEVICE_BUSY), then for one device
  of a class each (as many leases as there were free devices, all distinct, the rest
  INSUFFICIENT_DEVICES). The lease events are replayed by a ledger that flags any
  device granted while held; the lease table is checked after every round.
* Refusals run on a fresh host whose AER policy makes one recovered non-fatal error
  DEGRADE a device, and whose firmware rule makes a hot-added edu fail its self-check
  (FAULTED): DEGRADED and FAULTED devices are refused with NOT_HEALTHY naming the state,
  a held device with DEVICE_BUSY, an unknown one with UNKNOWN_DEVICE; a class request
  larger than the HEALTHY free devices is refused as a whole (INSUFFICIENT_DEVICES, no
  lease) and a class request never hands out a device that is not HEALTHY. A refused
  request changes no state and emits no transition.
"""

from __future__ import annotations

import threading
import time

import pytest
from lifecycle_support import (
    LeaseLedger,
    allocate,
    assert_leases_consistent,
    device_record,
    failing_add,
    flush,
    free_devices,
    health_moves,
    inject_nonfatal,
    quiet,
    refused,
    require_aer_recovery,
    require_empty_slot,
    runtime_config,
    settled_inventory,
    slot_of,
    subscribe_live,
    wait_procedure_end,
    wait_state,
    wait_until,
)

from hilconform.fixtures.errors import FaultError, Inconclusive, InfrastructureError
from hilconform.fixtures.guest_kernel_log import (
    kernel_log_lines,
    kernel_minus_monotonic_ns,
    kernel_recovery_window,
)
from hilconform.fixtures.host_protocol import ResetReadiness
from hilconform.fixtures.preconditions import RELEASED_BY_DEADLINE, RELEASED_BY_EVENT
from hilconform.fixtures.runtime_client import RuntimeCallError, RuntimeUnresponsive

pytestmark = pytest.mark.clause("LIFE-03")

RACE_ROUNDS = 3
TTL_S = 120  # longer than the test: expiry is LIFE-04's business


def _free_devices(runtime) -> list[str]:
    inventory = settled_inventory(runtime)
    return [d["device"] for d in inventory["devices"] if d["in_pool"] and d["lease"] is None]


@pytest.mark.walks("health: HEALTHY > ALLOCATED > RELEASED > HEALTHY@release_checkpoint")
@pytest.mark.walks("main: INITIALIZED > ALLOCATED > INITIALIZED")
def test_allocate_release_cycle(host):
    runtime = host.runtime
    checker, mark = subscribe_live(runtime)
    free = _free_devices(runtime)
    assert free, "no HEALTHY free device on the shared host"
    bdf = free[0]
    cycle = runtime.mark()

    lease = allocate(runtime, device=bdf, holder="life03-a", ttl_s=TTL_S)
    try:
        assert lease["devices"] == [bdf] and lease["holder"] == "life03-a", lease
        record = runtime.call("device", {"device": bdf})
        assert (record["state"], record["lease"], record["holder"], record["in_pool"]) == (
            "ALLOCATED", lease["lease"], "life03-a", False), record
        assert assert_leases_consistent(runtime).get(bdf) == lease["lease"]
    finally:
        released = runtime.call("release", {"lease": lease["lease"]})
    assert released.get("released") is True, released
    record = wait_state(runtime, bdf, {"HEALTHY"})
    assert (record["lease"], record["in_pool"]) == (None, True), record
    again = refused(lambda: runtime.call("release", {"lease": lease["lease"]}))
    assert again is not None and again.code == "UNKNOWN_LEASE", f"second release: {again!r}"

    flush(runtime)
    assert health_moves(runtime, cycle, bdf) == [
        ("HEALTHY", "ALLOCATED"), ("ALLOCATED", "RELEASED"), ("RELEASED", "HEALTHY")]
    checker.feed_all(runtime.events(mark))
    checker.assert_clean()
    assert bdf not in assert_leases_consistent(runtime)


def _ids(record: dict) -> str:
    return f"{record['info']['vendor_id']}:{record['info']['device_id']}"


def _free_of_one_kind(runtime) -> tuple[str, list[str]]:
    """The IDs of the first free device, and every free device with those IDs."""
    inventory = settled_inventory(runtime)["devices"]
    free = [d for d in inventory if d["in_pool"] and d["lease"] is None]
    ids = _ids(free[0])
    return ids, [d["device"] for d in free if _ids(d) == ids]


def _race(runtime, requests: list[dict]) -> list[dict | RuntimeCallError]:
    """Send every request from its own thread at the same moment; the answers, in order."""
    barrier = threading.Barrier(len(requests))
    answers: list = [None] * len(requests)

    def ask(i: int, params: dict) -> None:
        barrier.wait(timeout=10)
        try:
            answers[i] = runtime.call("allocate", params, timeout_s=20)
        except RuntimeCallError as exc:
            answers[i] = exc

    threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(a is not None for a in answers), "an allocate got no answer"
    return answers


def test_racing_holders_never_share_a_device(host):
    runtime = host.runtime
    _, mark = subscribe_live(runtime)
    free = free_devices(host, runtime, needed=2)
    assert len(free) >= 2, f"need two free devices on the shared host, have {free}"
    ledger = LeaseLedger()
    granted: list[str] = []
    try:
        for round_no in range(RACE_ROUNDS):
            target = free[round_no % len(free)]
            answers = _race(runtime, [{"device": target, "holder": f"life03-h{i}", "ttl_s": TTL_S}
                                      for i in range(6)])
            leases = [a for a in answers if isinstance(a, dict)]
            granted += [a["lease"] for a in leases]
            codes = sorted(a.code for a in answers if isinstance(a, RuntimeCallError))
            assert len(leases) == 1 and codes == ["DEVICE_BUSY"] * 5, (
                f"round {round_no}: 6 holders asked for {target}: {len(leases)} lease(s), refusals {codes}")
            assert_leases_consistent(runtime)
            runtime.call("release", {"lease": leases[0]["lease"]})
            granted.remove(leases[0]["lease"])
            wait_state(runtime, target, {"HEALTHY"})

            ids, free_now = _free_of_one_kind(runtime)
            answers = _race(runtime, [{"class": ids, "holder": f"life03-c{i}", "ttl_s": TTL_S}
                                      for i in range(len(free_now) + 3)])
            leases = [a for a in answers if isinstance(a, dict)]
            granted += [a["lease"] for a in leases]
            got = [d for a in leases for d in a["devices"]]
            codes = {a.code for a in answers if isinstance(a, RuntimeCallError)}
            assert sorted(got) == sorted(set(got)), f"round {round_no}: a device in two leases: {got}"
            assert sorted(got) == sorted(free_now), (
                f"round {round_no}: {len(free_now)} free devices, class leases got {got}")
            assert codes == {"INSUFFICIENT_DEVICES"}, f"round {round_no}: refusals {codes}"
            assert_leases_consistent(runtime)
            for lease in leases:
                runtime.call("release", {"lease": lease["lease"]})
                granted.remove(lease["lease"])
            for bdf in got:
                wait_state(runtime, bdf, {"HEALTHY"})
    finally:
        for lease_id in granted:
            refused(lambda lease_id=lease_id: runtime.call("release", {"lease": lease_id}))
    flush(runtime)
    ledger.feed_all(runtime.events(mark))
    ledger.assert_clean()
    assert assert_leases_consistent(runtime) == {}


# A recovered non-fatal error DEGRADES a device (policy; thresholds out of reach, so the
# outcome does not hang on error counting, LIFE-05's business); a hot-added device that
# fails its self-check's firmware step (lifecycle_support.failing_add: edu where 9.9 is
# expected on stock hosts, a model with a mismatched firmware register on model hosts) is FAULTED.
DEGRADING_POLICY = {"aer": {"nonfatal_recovered": "DEGRADED", "degrade_weight": 1000.0,
                            "fault_weight": 1000.0, "reset_weight": 1000.0}}


@pytest.mark.destructive
def test_allocating_a_device_that_is_not_healthy_is_refused(host_factory):
    profile = host_factory.profile
    failing = failing_add(host_factory)
    if failing is None:
        why = ("it has no empty hot-plug slot" if all(sl.populated for sl in profile.slots)
               else "every stand-in kind is a boot device's")
        pytest.skip(f"profile {profile.name}: no device can be made to fail its self-check alone: {why}")
    changes = {**DEGRADING_POLICY, **failing.config}
    host = host_factory.fresh(runtime_config=runtime_config(host_factory, changes))
    runtime = host.runtime
    checker, mark = subscribe_live(runtime)
    boot = settled_inventory(runtime)["devices"]
    degraded, rest = boot[0]["device"], [d["device"] for d in boot[1:]]
    require_aer_recovery(boot[0])
    held_device, free = (rest[0], rest[1:]) if rest else (None, [])
    ids = _ids(boot[0])

    inject_nonfatal(host, slot_of(host, degraded), degraded)
    faulted = failing.add(host, require_empty_slot(host)[0])
    wait_procedure_end(runtime, mark, "hot_add", faulted)
    assert wait_state(runtime, degraded, {"DEGRADED", "FAULTED"})["state"] == "DEGRADED"
    assert wait_state(runtime, faulted, {"HEALTHY", "FAULTED"})["state"] == "FAULTED"
    held = allocate(runtime, device=held_device, holder="life03-holder", ttl_s=TTL_S) if held_device else None
    before = {d["device"]: (d["state"], d["lease"]) for d in runtime.call("inventory")["devices"]}
    quiet = runtime.mark()

    for bdf, state in ((degraded, "DEGRADED"), (faulted, "FAULTED")):
        error = refused(lambda bdf=bdf: allocate(runtime, device=bdf, holder="life03-other", ttl_s=TTL_S))
        assert error is not None, f"a {state} device ({bdf}) was allocated"
        assert error.code == "NOT_HEALTHY" and state in error.message, (
            f"allocating a {state} device: expected NOT_HEALTHY naming {state}, got {error!r}")
    if held_device:
        busy = refused(lambda: allocate(runtime, device=held_device, holder="life03-other", ttl_s=TTL_S))
        assert busy is not None and busy.code == "DEVICE_BUSY", f"allocating a held device: {busy!r}"
    unknown = refused(lambda: allocate(runtime, device="0000:7f:00.0", holder="life03-other"))
    assert unknown is not None and unknown.code == "UNKNOWN_DEVICE", f"unknown device: {unknown!r}"
    too_many = refused(lambda: allocate(runtime, **{"class": ids, "count": len(free) + 1},
                                        holder="life03-other"))
    assert too_many is not None and too_many.code == "INSUFFICIENT_DEVICES", (
        f"{len(free) + 1} devices asked, only {free} are HEALTHY and free: {too_many!r}")
    # One more than the free HEALTHY devices of the failing IDs (none on a stock host, whose failing
    # kind no boot device is): granted only if the FAULTED one counts.
    same = 1 + sum(1 for bdf in free if _ids(runtime.call("device", {"device": bdf})) == failing.ids)
    by_ids = refused(lambda: allocate(runtime, **{"class": failing.ids, "count": same},
                                      holder="life03-other"))
    assert by_ids is not None and by_ids.code == "INSUFFICIENT_DEVICES", (
        f"{same} of class {failing.ids} ({same - 1} HEALTHY and free besides the FAULTED {faulted}): "
        f"{by_ids!r}")
    leases = [x["lease"] for x in runtime.call("leases")["leases"]]
    assert leases == ([held["lease"]] if held else []), f"a refused request left a lease: {leases}"
    after = {d["device"]: (d["state"], d["lease"]) for d in runtime.call("inventory")["devices"]}
    assert after == before, f"refused requests changed the inventory: {before} -> {after}"
    flush(runtime)
    assert runtime.events(quiet, "transition") == [], "a refused request caused a transition"

    if free:
        granted = allocate(runtime, **{"class": ids, "count": len(free)}, holder="life03-other", ttl_s=TTL_S)
        assert sorted(granted["devices"]) == sorted(free), (
            f"the HEALTHY free devices are {free}, the class allocation got {granted['devices']}")
    flush(runtime)
    checker.feed_all(runtime.events(mark))
    checker.assert_clean()
    assert_leases_consistent(runtime)


PROBE_EVERY_S = 0.01  # each prober's pause between one answer (and its release) and its next ask
PROBERS = 3  # sequential probers, staggered: one held up in the runtime does not stop the others
REACTION_MS = 100.0  # how long after the kernel logs the error a runtime may take to hear of it (TCG, loaded)
MIN_JUDGED = 3  # answers on the device's health (see _Observation.judged) inside the judged window
MAX_ASKS = 400  # each prober's bound
PROBE_START_MS = REACTION_MS + 20.0  # the probe's first request, after the injection (host clock)
RECOVERY_TIMEOUT_S = 20.0  # the kernel's recovery line after a fatal error (a switch's takes ~1.2 s)
OBSERVATIONS = 6  # fatal errors injected at most, one after another, until one window was covered
RECOVER_TIMEOUT_S = 30.0  # the runtime's recover procedure (a reset) of a DEGRADED device
HEALTHY_AGAIN_S = 15.0  # how long a device recovered by the kernel may take to be HEALTHY again
HOLD_MAX_S = 20.0  # a recovery window held open (reset-not-ready) at most this long; the kernel waits 60 s
HOLD_ANSWERS = MIN_JUDGED + 2  # answers the hold waits for (a margin over MIN_JUDGED for the clock mapping)


class _Observation:
    """One fatal error through a stream of allocate requests: the kernel's window (runtime clock)
    and every answer, with the host clock mapped onto the runtime's."""

    def __init__(self, bdf: str, window: tuple[int, int, str], answers: list, host_minus_runtime: int,
                 probed_throughout: bool = False, hold=None):
        self.bdf = bdf
        self.hold = hold  # the precondition record where the window was held open
        self.probed_throughout = probed_throughout  # the probe ran from before the injection
        self.began, self.ended, self.outcome = window
        self.judged_from = self.began + int(REACTION_MS * 1e6)
        self.answers = answers
        self.host_minus_runtime = host_minus_runtime

    def grants_inside(self) -> list[dict]:
        grants = [a for _, _, a in self.answers if isinstance(a, dict)]
        return [g for g in grants if self.judged_from <= g["granted_ns"] <= self.ended]

    def judged(self) -> int:
        """Answers on the device's health to requests sent inside the judged window: a grant, or a
        refusal that is not the probe's own doing. DEVICE_BUSY (the other prober's lease, or its
        allocate in flight) and NOT_HEALTHY naming state ALLOCATED or RELEASED (a probe lease, or its
        release checkpoint) say the device was held, not whether it may be granted. A probe that ran
        from before the injection (`probed_throughout`) counts every answer: a weaker judgement
        (its own leases can cover the window), for hosts whose injection returns too late."""
        return sum(1 for sent, _, a in self.answers
                   if self.judged_from <= sent - self.host_minus_runtime <= self.ended
                   and (self.probed_throughout or not _held(a)))

    def started_late(self) -> bool:
        """The probe's first request went out after the window had ended (the host's injection
        returned too late for a probe started after it)."""
        first = min((sent for sent, _, _ in self.answers), default=None)
        return first is None or first - self.host_minus_runtime > self.ended

    def summary(self) -> str:
        def at_ms(sent: int) -> int:
            return round((sent - self.host_minus_runtime - self.began) / 1e6)

        timeline = [(at_ms(sent), round((replied - sent) / 1e6),
                     a.code if isinstance(a, RuntimeCallError) else "granted")
                    for sent, replied, a in sorted(self.answers, key=lambda answer: answer[0])]
        return (f"{self.bdf}: {self.judged()} of {len(self.answers)} requests judged inside the kernel's "
                f"{(self.ended - self.began) / 1e6:.0f} ms recovery window (ms after the error line, "
                f"round trip ms, answer: {timeline})")


def _held(answer) -> bool:
    """A refusal because the device was held (by the probe itself), not judged on its health."""
    return isinstance(answer, RuntimeCallError) and (
        answer.code == "DEVICE_BUSY"
        or (answer.code == "NOT_HEALTHY" and answer.data.get("state") in ("ALLOCATED", "RELEASED")))


def _hold_window_open(host, slot: str):
    """The host's ResetReadiness, with `slot`'s device set to stay not ready after its next reset
    for up to HOLD_MAX_S, so the kernel's recovery from the coming fatal error (a link reset)
    waits for it: the window stays open until the probe has its answers. None where the host
    cannot (no reset-not-ready, or not a device-model slot): the window is then the kernel's own."""
    if "reset-not-ready" not in host.capabilities:
        return None
    readiness = host.get(ResetReadiness)
    try:
        readiness.delay_reset_ready(slot, HOLD_MAX_S)
    except FaultError:  # the capability is the host's; this slot's device may lack it
        return None
    return readiness


def _observe_fatal_recovery(host, runtime, slot: str, throughout: bool = False,
                            preconditions=None) -> _Observation:
    """Inject a fatal error above `slot`'s device; from PROBE_START_MS after the injection,
    PROBERS threads ask to allocate the device, each one request at a time: a grant is released
    (and the release answered) before that prober asks again.

    Nothing is asked before PROBE_START_MS: a lease the probe held (or the release checkpoint
    after it) when the window opened would hide whether the device may be granted inside it.
    PROBE_START_MS is REACTION_MS plus the time the error takes to reach the guest's kernel
    (~15 ms), so the first request lands at the start of the judged window.

    `throughout`: for a host whose injection returns after the kernel's window has ended (a real
    host over SSH: the write to /dev/aer_inject is done, and its window over, before the
    command's reply is back; its lag varies by hundreds of ms), the probers run from before the
    injection.

    Where the host can hold the window open (`_hold_window_open`), it is held until HOLD_ANSWERS
    answers came to requests sent REACTION_MS after the runtime's first refusal on the device's
    health was back (the runtime's own sign that it knows of the error), then released: on a
    loaded host a ~0.2 s kernel recovery otherwise closes before the probe's round trips (up to
    1 s) can land inside it. A runtime that never refuses is held the whole HOLD_MAX_S, and its
    grants fall inside the window. The hold is recorded as a precondition."""
    bdf = host.target_bdf(slot)
    offset_ns = kernel_minus_monotonic_ns(host)
    log_start = kernel_log_lines(host)[-1][0]
    readiness = _hold_window_open(host, slot)
    hold_record = None
    if readiness is not None and preconditions is not None:
        hold_record = preconditions.open_record(
            "recovery_window_held", "the kernel's recovery window open while allocate was probed",
            f"{HOLD_ANSWERS} answers to requests sent {REACTION_MS:.0f} ms after the runtime first "
            f"refused the device on its health")
    released = threading.Event()
    release_lock = threading.Lock()

    def end_hold(released_by: str) -> None:
        """The device ready again at once (the kernel's recovery goes on), the hold recorded."""
        with release_lock:
            if readiness is None or released.is_set():
                return
            readiness.delay_reset_ready(slot, None)
            released.set()
            if hold_record is not None:
                preconditions.close_record(hold_record, released_by, time.monotonic_ns())

    def release_when_answered() -> None:
        """End the hold once HOLD_ANSWERS answers came to requests sent REACTION_MS after the
        runtime's first refusal on the device's health was back: that reply came after the runtime
        knew of the error, so after the kernel's error line."""
        if readiness is None or released.is_set():
            return
        seen = list(answers)
        knew = min((replied for _, replied, a in seen if isinstance(a, RuntimeCallError) and not _held(a)),
                   default=None)
        if knew is None:
            return
        after_ns = knew + int(REACTION_MS * 1e6)
        if sum(1 for sent, _, a in seen if sent >= after_ns and not _held(a)) >= HOLD_ANSWERS:
            end_hold(RELEASED_BY_EVENT)

    go, stop = threading.Event(), threading.Event()
    start = {"at_ns": 0}  # host clock: when the probers begin
    answers: list[tuple[int, int, dict | RuntimeCallError]] = []  # (host sent, host replied, answer)

    def probe(stagger_s: float) -> None:
        if not go.wait(60):
            return
        stop.wait(max(0.0, (start["at_ns"] - time.monotonic_ns()) / 1e9) + stagger_s)
        for _ in range(MAX_ASKS):
            if stop.is_set():
                return
            sent = time.monotonic_ns()
            try:
                answer = runtime.call("allocate", {"device": bdf, "holder": "life03-probe", "ttl_s": TTL_S})
            except RuntimeCallError as exc:
                answer = exc
            answers.append((sent, time.monotonic_ns(), answer))
            if isinstance(answer, dict):
                lease = answer["lease"]
                refused(lambda: runtime.call("release", {"lease": lease}))  # noqa: B023 (called at once)
            release_when_answered()
            stop.wait(PROBE_EVERY_S)

    probers = [threading.Thread(target=probe, args=(i * PROBE_EVERY_S / PROBERS,),
                                name=f"life03-probe-{i}", daemon=True) for i in range(PROBERS)]
    for prober in probers:
        prober.start()
    if throughout:
        go.set()
    try:
        called_ns = time.monotonic_ns()

        def probe_from(injected_ns: int) -> None:  # at once, not after the injection's verification
            if not throughout:
                # The error went in between the call and QEMU's reply: on a loaded runner the reply
                # alone took tens of ms (the kernel's error line came ~30 ms before it arrived).
                start["at_ns"] = (called_ns + injected_ns) // 2 + int(PROBE_START_MS * 1e6)
                go.set()

        fault = host.get("aer-fatal").aer_fatal(slot, on_injected=probe_from)
        port_bdf = fault.details["port_bdf"]
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S + (HOLD_MAX_S if readiness is not None else 0.0)
        while (window := kernel_recovery_window(host, port_bdf, log_start)) is None:
            if time.monotonic() > deadline:
                raise InfrastructureError(
                    f"the guest kernel logged no AER recovery at {port_bdf} within {RECOVERY_TIMEOUT_S} s"
                    + (f" after the {HOLD_MAX_S:g} s hold" if readiness is not None else ""))
            stop.wait(0.05)
        stop.wait(0.2)  # the probe goes on a little past the recovery line
    finally:
        go.set()
        stop.set()
        for prober in probers:
            prober.join(60)
        end_hold(RELEASED_BY_DEADLINE)  # where no answers ended it: the deadline (or an error) did
    # the host clock mapped onto the runtime's through its event stream: least host receipt - ts_ns
    host_minus_runtime = min(e["host_ns"] - e["ts_ns"] for e in runtime.events(0))
    began, ended, outcome = window
    return _Observation(bdf, (began - offset_ns, ended - offset_ns, outcome), answers, host_minus_runtime,
                        throughout, hold_record)


def _healthy_slot(host, runtime, slots: list[str], timeout_s: float) -> str | None:
    """The first of `slots` whose device is HEALTHY and quiet, waiting up to timeout_s for one."""
    def probe():
        for slot in slots:
            record = device_record(runtime, host.target_bdf(slot))
            if record["state"] == "HEALTHY" and quiet(record):
                return slot
        return None
    try:
        return wait_until(runtime, probe, timeout_s, f"a HEALTHY device in {slots}")
    except RuntimeUnresponsive:
        return None


def _judge_observations(host, runtime, slots: list[str], observations: list, preconditions=None) -> bool:
    """Observe fatal errors one after another (appending to `observations`) until one window was
    covered by MIN_JUDGED answers: True; False when OBSERVATIONS ran out or no device was HEALTHY."""
    order = slots[:]
    throughout = False
    while len(observations) < OBSERVATIONS:
        hit = {o.bdf for o in observations}
        untried = [s for s in order if host.target_bdf(s) not in hit]
        if not untried:  # every target was hit: recover what the errors left out of service
            _leave_recovered(runtime, hit)
        slot = _healthy_slot(host, runtime, untried or order, HEALTHY_AGAIN_S)
        if slot is None:
            break
        seen = _observe_fatal_recovery(host, runtime, slot, throughout, preconditions)
        observations.append(seen)
        if seen.hold is not None:
            preconditions.settle(seen.hold, seen.judged() >= MIN_JUDGED,
                                 f"{seen.judged()} answers judged inside the held window")
        throughout = throughout or seen.started_late()
        inside = [(g["lease"], round((g["granted_ns"] - seen.began) / 1e6, 1)) for g in seen.grants_inside()]
        assert not inside, (
            f"{seen.bdf} was allocated while the kernel recovered it from a fatal error (error logged "
            f"at {seen.began / 1e9:.3f} s, recovery {seen.outcome} at {seen.ended / 1e9:.3f} s, runtime "
            f"clock): leases {inside} (ms after the error)")
        refusals = [a for _, _, a in seen.answers if isinstance(a, RuntimeCallError)]
        odd = [a for a in refusals if a.code not in ("NOT_HEALTHY", "DEVICE_BUSY")]
        assert not odd, f"allocate of {seen.bdf} refused with unexpected errors: {odd[:3]}"
        if seen.judged() >= MIN_JUDGED:
            print(seen.summary())  # the timeline, for -rP and the report's captured output
            return True
        order = order[1:] + order[:1]  # the next slot first: this one's device is still recovering
    return False


def _leave_recovered(runtime, bdfs: set[str]) -> None:
    """Recover what the fatal errors left DEGRADED or FAULTED (the profile's fatal_recovered
    policy, or a failed kernel recovery; the runtime resets a FAULTED device and runs its whole
    self-check). Best effort: this is cleanup, and the test's own verdict stands."""
    for bdf in sorted(bdfs):
        try:
            record = wait_state(runtime, bdf, {"HEALTHY", "DEGRADED", "FAULTED"})
            if record["state"] in ("DEGRADED", "FAULTED"):
                runtime.call("recover", {"device": bdf}, timeout_s=RECOVER_TIMEOUT_S)
        except (AssertionError, RuntimeCallError):
            pass


@pytest.mark.destructive
@pytest.mark.needs("aer-fatal")
def test_a_device_in_error_recovery_is_never_allocated(host, preconditions):
    """From the moment the kernel logs an uncorrectable error above a device until its recovery
    ends, the device is not HEALTHY: an allocate is refused, however it is timed.

    A fatal error is injected at the root port above a HEALTHY device; from PROBE_START_MS after
    it, PROBERS probers ask to allocate the device, one request at a time each (a grant is released
    before its prober asks again), until past the kernel's recovery line.
    The kernel's window comes from the guest's own log (the error line and the recovery line,
    printk time), mapped onto the runtime's clock (CLOCK_MONOTONIC) by a marker written into
    /dev/kmsg; no lease may be granted from REACTION_MS after the error line until the recovery
    line. A window is judged only if MIN_JUDGED requests sent inside it were answered on the
    device's health (granted, or refused other than DEVICE_BUSY: the other prober's lease or
    request in flight); a window the probe missed (a kernel recovery of 150 ms, a host stall) is
    observed again with another fatal error (the next aer-fatal slot whose device is HEALTHY; once
    every target was hit, the devices the errors left out of service are recovered first), up to
    OBSERVATIONS times, then the clause is inconclusive (the test bed too slow to probe inside
    a window). When a probe started after the
    injection came too late for the window (the host's injection returned after the kernel was
    done: a real host over SSH), the next observations probe from before the injection and count
    every answer inside the window (a weaker judgement: the probe's own leases can cover it). Every
    observed window is judged, covered or not. The devices the errors left DEGRADED or FAULTED
    are recovered at the end, so a shared or real host is left as found.
    """
    slots = host.targets("aer-fatal")
    runtime = host.runtime
    subscribe_live(runtime)
    settled_inventory(runtime)
    assert _healthy_slot(host, runtime, slots, HEALTHY_AGAIN_S) is not None, (
        f"precondition: none of the aer-fatal targets {slots} is HEALTHY")
    observations: list[_Observation] = []
    try:
        if _judge_observations(host, runtime, slots, observations, preconditions):
            return
    finally:
        _leave_recovered(runtime, {o.bdf for o in observations})
    # The test bed answered too slowly to probe inside any window (a loaded runner: round trips
    # of over a second against windows of ~0.2 s): neither a pass nor a failure.
    raise Inconclusive(
        f"LIFE-03 test bed: no recovery window covered by {MIN_JUDGED} allocate requests in "
        f"{len(observations)} fatal error(s) (at most {OBSERVATIONS}; the next needs a HEALTHY "
        f"aer-fatal device): " + "; ".join(o.summary() for o in observations))
