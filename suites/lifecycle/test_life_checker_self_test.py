"""Self-tests of the LIFE suite's own judges (no VM): the transition checker
(fixtures/transition_checker.py) and the lease ledger must reject each kind of broken
stream, or the conformance tests built on them could not fail. The table mirrors the
shape of the protocol's `transitions` result. The checker's rules on causes, operation
runs and seq gaps have their own unit tests (tests/unit/test_transition_checker_causes.py).
"""

from __future__ import annotations

import pytest
from lifecycle_support import LeaseLedger

from hilconform.fixtures.transition_checker import PublishedTableError, TransitionChecker

HEALTH_PAIRS = [
    ("DISCOVERED", "HEALTHY"), ("DISCOVERED", "FAULTED"), ("HEALTHY", "ALLOCATED"),
    ("ALLOCATED", "RELEASED"), ("RELEASED", "HEALTHY"), ("HEALTHY", "DEGRADED"),
    ("DEGRADED", "HEALTHY"), ("DEGRADED", "FAULTED"), ("HEALTHY", "REMOVED"),
    ("ALLOCATED", "REMOVED"), ("FAULTED", "REMOVED"), ("DEGRADED", "REMOVED"),
]
MAIN_PAIRS = [
    ("POWER_OFF", "FIRMWARE_LOADED"), ("FIRMWARE_LOADED", "INITIALIZED"), ("INITIALIZED", "ALLOCATED"),
    ("ALLOCATED", "INITIALIZED"), ("INITIALIZED", "POWER_OFF"), ("ALLOCATED", "POWER_OFF"),
    ("POWER_OFF", "ERROR"), ("INITIALIZED", "ERROR"), ("ERROR", "POWER_OFF"),
]
# The moves the spec restricts (fixtures/transition_rules.toml), published as a runtime must.
CAUSES = {("RELEASED", "HEALTHY"): ["release_checkpoint"], ("DEGRADED", "HEALTHY"): ["recover"]}


def _causes(frm: str, to: str) -> dict:
    return {"causes": CAUSES[frm, to]} if (frm, to) in CAUSES else {}


TABLE = {
    "version": 1,
    "views": {
        "health": {"initial": "DISCOVERED", "terminal": ["REMOVED"],
                   "states": ["DISCOVERED", "HEALTHY", "ALLOCATED", "RELEASED", "DEGRADED", "FAULTED",
                              "REMOVED"],
                   "transitions": [{"from": f, "to": t, **_causes(f, t)} for f, t in HEALTH_PAIRS]},
        "main": {"initial": "POWER_OFF", "terminal": [],
                 "states": ["POWER_OFF", "FIRMWARE_LOADED", "INITIALIZED", "ALLOCATED", "RUNNING", "ERROR"],
                 "transitions": [{"from": f, "to": t} for f, t in MAIN_PAIRS]},
    },
    "combination": {"DISCOVERED>HEALTHY": "INITIALIZED", "HEALTHY>ALLOCATED": "ALLOCATED",
                    "ALLOCATED>RELEASED": "INITIALIZED", "*>FAULTED": "ERROR", "*>REMOVED": "POWER_OFF"},
}
OK = {"name": "config_intact", "ok": True, "problems": []}
DEV = "0000:01:00.0"


class Stream:
    """Builds transition events the way a runtime numbers them."""

    def __init__(self):
        self.seq = 0
        self.ts = 1_000_000
        self.events: list[dict] = []

    def move(self, view, frm, to, device=DEV, **overrides):
        self.seq += 1
        self.ts += 1000
        restricted = CAUSES.get((frm, to)) if view == "health" else None
        cause = f"{restricted[0]}:test" if restricted else f"test:{to.lower()}"
        data = {"device": device, "view": view, "from": frm, "to": to, "cause": cause,
                "checkpoint": dict(OK), "ts_ns": self.ts, **overrides}
        self.events.append({"event": "transition", "seq": self.seq, "ts_ns": self.ts, "data": data})
        return self

    def boot(self, device=DEV):
        return (self.move("main", "POWER_OFF", "FIRMWARE_LOADED", device)
                .move("health", "DISCOVERED", "HEALTHY", device)
                .move("main", "FIRMWARE_LOADED", "INITIALIZED", device))

    def allocate_release(self, device=DEV):
        return (self.move("health", "HEALTHY", "ALLOCATED", device)
                .move("main", "INITIALIZED", "ALLOCATED", device)
                .move("health", "ALLOCATED", "RELEASED", device)
                .move("main", "ALLOCATED", "INITIALIZED", device)
                .move("health", "RELEASED", "HEALTHY", device))


def check(stream: Stream, complete: bool = True) -> TransitionChecker:
    checker = TransitionChecker(TABLE, complete_history=complete)
    checker.feed_all(stream.events)
    checker.finish()
    return checker


def test_a_legal_complete_stream_passes():
    stream = Stream().boot().allocate_release().boot("0000:02:00.0")
    checker = check(stream)
    checker.assert_clean()
    assert checker.checked == len(stream.events)
    checker.assert_matches_inventory([{"device": DEV, "state": "HEALTHY", "main_state": "INITIALIZED"}])


BROKEN_STREAMS = [
    (lambda s: s.boot().move("health", "HEALTHY", "RELEASED"), "not in the published health table"),
    (lambda s: s.boot().move("health", "HEALTHY", "BROKEN"), "not a state of view"),
    (lambda s: s.boot().move("power", "ON", "OFF"), "unknown view"),
    (lambda s: s.boot().move("health", "HEALTHY", "ALLOCATED", cause=""), "no cause"),
    (lambda s: s.boot().move("health", "HEALTHY", "DEGRADED", ts_ns=None), "no ts_ns"),
    (lambda s: s.boot().move("health", "HEALTHY", "DEGRADED", checkpoint=None), "no checkpoint"),
    (lambda s: s.boot().move("health", "HEALTHY", "DEGRADED", checkpoint={"ok": False}),
     "checkpoint without a name"),
    (lambda s: s.boot().move("health", "HEALTHY", "ALLOCATED",
                             checkpoint={"name": "config_intact", "ok": False}),
     "without passing its checkpoint"),
    (lambda s: s.boot().move("health", "DEGRADED", "HEALTHY"), "discontinuous"),
    (lambda s: s.boot().move("health", "HEALTHY", "DEGRADED", ts_ns=5), "went backwards"),
    (lambda s: s.move("health", "HEALTHY", "DEGRADED"), "not at the initial state"),
    (lambda s: s.boot().move("health", "HEALTHY", "ALLOCATED"), "never came"),
    (lambda s: s.move("main", "POWER_OFF", "FIRMWARE_LOADED").move("health", "DISCOVERED", "HEALTHY")
     .move("health", "HEALTHY", "DEGRADED"), "that the published combination pairs with"),
    (lambda s: s.boot().move("health", "HEALTHY", "REMOVED").move("main", "INITIALIZED", "POWER_OFF")
     .move("health", "HEALTHY", "DEGRADED"), "new record"),
]


@pytest.mark.parametrize("broken, expected", BROKEN_STREAMS,
                         ids=[expected.replace(" ", "-") for _, expected in BROKEN_STREAMS])
def test_each_kind_of_broken_stream_is_rejected(broken, expected):
    checker = check(broken(Stream()))
    assert any(expected in v for v in checker.violations), checker.violations
    with pytest.raises(AssertionError, match="transition violation"):
        checker.assert_clean()


def test_a_device_that_comes_back_after_removal_is_a_new_record():
    stream = (Stream().boot().move("health", "HEALTHY", "REMOVED").move("main", "INITIALIZED", "POWER_OFF")
              .boot())
    check(stream).assert_clean()


def test_replayed_events_count_once_and_late_ones_are_flagged():
    stream = Stream().boot().allocate_release()
    checker = TransitionChecker(TABLE, complete_history=True)
    checker.feed_all(stream.events[:4])
    checker.feed_all(stream.events)  # a replay after a re-subscribe
    checker.assert_clean()
    assert checker.checked == len(stream.events)
    other = Stream().boot("0000:02:00.0").events[0]
    checker.feed(other)  # seq 1 again, with other data
    assert any("seen twice with different data" in v for v in checker.violations)
    checker.feed({**other, "seq": 0})  # never seen, but older than what was checked
    assert any("out of order" in v for v in checker.violations)


def test_a_partial_stream_starts_anywhere_but_stays_continuous():
    stream = Stream().move("health", "HEALTHY", "ALLOCATED").move("main", "INITIALIZED", "ALLOCATED")
    check(stream, complete=False).assert_clean()
    stream.move("health", "RELEASED", "HEALTHY")
    assert any("discontinuous" in v for v in check(stream, complete=False).violations)


def test_inventory_that_disagrees_with_the_stream_is_rejected():
    checker = check(Stream().boot())
    with pytest.raises(AssertionError, match="inventory says health ALLOCATED"):
        checker.assert_matches_inventory([{"device": DEV, "state": "ALLOCATED", "main_state": "INITIALIZED"}])
    with pytest.raises(AssertionError, match="no transition of it was ever emitted"):
        checker.assert_matches_inventory([{"device": "0000:09:00.0", "state": "HEALTHY",
                                           "main_state": "INITIALIZED"}])


def test_a_malformed_published_table_is_refused():
    with pytest.raises(PublishedTableError):
        TransitionChecker({"views": {"health": {"initial": "X", "states": ["A"], "transitions": []}}})


def test_the_lease_ledger_flags_a_device_granted_twice():
    ledger = LeaseLedger()
    granted = {"event": "lease", "seq": 1, "data": {"action": "granted", "lease": "L1", "holder": "a",
                                                    "devices": [DEV]}}
    again = {"event": "lease", "seq": 2, "data": {"action": "granted", "lease": "L2", "holder": "b",
                                                  "devices": [DEV]}}
    ledger.feed_all([granted])
    ledger.assert_clean()
    ledger.feed_all([granted, again])
    with pytest.raises(AssertionError, match="L2 .* while L1 holds it"):
        ledger.assert_clean()
    released = {"event": "lease", "seq": 3, "data": {"action": "released", "lease": "L1", "holder": "a",
                                                     "devices": [DEV]}}
    fresh = LeaseLedger()
    fresh.feed_all([granted, released, {**again, "seq": 4}])
    fresh.assert_clean()
