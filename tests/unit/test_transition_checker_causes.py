"""The LIFE-01 checker's rules on causes (fixtures/transition_checker.py, transition_rules.toml):
what a published table may allow, which cause kinds may take the ways back to HEALTHY, that a
`recover` cause is believed only inside an open `recover` run of the device, and that gaps in
`seq` reset what the checker knows instead of reading as violations. Synthetic events, no VM.
"""

from __future__ import annotations

import copy

import pytest

from hilconform.fixtures.transition_checker import PublishedTableError, TransitionChecker
from hilconform.fixtures.transition_rules import RulesError, TransitionRules, spec_rules
from hilconform.runtime.lifecycle import TransitionTable

DEV, OTHER = "0000:01:00.0", "0000:02:00.0"
HEALTH = ["DISCOVERED", "HEALTHY", "ALLOCATED", "RELEASED", "DEGRADED", "FAULTED", "REMOVED"]
PAIRS = [("DISCOVERED", "HEALTHY"), ("HEALTHY", "ALLOCATED"), ("ALLOCATED", "RELEASED"),
         ("RELEASED", "HEALTHY"), ("HEALTHY", "DEGRADED"), ("DEGRADED", "HEALTHY"),
         ("DEGRADED", "FAULTED"), ("FAULTED", "HEALTHY"), ("HEALTHY", "REMOVED")]
CAUSES = {("RELEASED", "HEALTHY"): ["release_checkpoint"], ("DEGRADED", "HEALTHY"): ["recover"],
          ("FAULTED", "HEALTHY"): ["recover"]}


def table(causes: dict | None = None, extra_pairs: tuple = ()) -> dict:
    """A health-only published table (no main view: no combination to follow)."""
    causes = CAUSES if causes is None else causes
    moves = [{"from": f, "to": t, **({"causes": causes[f, t]} if (f, t) in causes else {})}
             for f, t in [*PAIRS, *extra_pairs]]
    return {"version": 1, "views": {"health": {"initial": "DISCOVERED", "terminal": ["REMOVED"],
                                               "states": HEALTH, "transitions": moves}},
            "combination": {}}


class Stream:
    """Events numbered as a runtime numbers them (every kind takes a seq)."""

    def __init__(self, seq: int = 0):
        self.seq, self.ts, self.events = seq, 1_000_000, []

    def _event(self, name: str, data: dict) -> Stream:
        self.seq += 1
        self.ts += 1000
        self.events.append({"event": name, "seq": self.seq, "ts_ns": self.ts, "data": data})
        return self

    def move(self, frm: str, to: str, cause: str, device: str = DEV) -> Stream:
        return self._event("transition", {"device": device, "view": "health", "from": frm, "to": to,
                                          "cause": cause, "checkpoint": {"name": "c", "ok": True},
                                          "ts_ns": self.ts + 1000})

    def step(self, step: str, run: str = "recover-1", device: str = DEV,
             procedure: str = "recover") -> Stream:
        return self._event("procedure", {"procedure": procedure, "run": run, "device": device,
                                         "entry": "request", "step": step, "status": "ok"})

    def other(self) -> Stream:
        return self._event("lease", {"action": "renewed"})

    def skip(self, count: int) -> Stream:
        """Events the client never got (dropped for it)."""
        self.seq += count
        return self

    def degraded(self, device: str = DEV) -> Stream:
        return self.move("DISCOVERED", "HEALTHY", "hot_add:boot", device).move(
            "HEALTHY", "DEGRADED", "aer:recovered_nonfatal", device)

    def recovered(self, run: str = "recover-1") -> Stream:
        return self.step("begin", run).move("DEGRADED", "HEALTHY", "recover").step("end", run)


def judged(stream: Stream, complete: bool = True, published: dict | None = None) -> TransitionChecker:
    checker = TransitionChecker(published or table(), complete_history=complete)
    checker.feed_all(stream.events)
    checker.finish()
    return checker


def found(checker: TransitionChecker, text: str) -> bool:
    return any(text in v for v in checker.violations)


# -- the published table against the spec's rules ----------------------------------------------

def test_the_reference_runtimes_table_allows_no_more_than_the_spec():
    assert TransitionChecker(TransitionTable.load().to_dict()).violations == []


@pytest.mark.parametrize(("published", "expected"), [
    (table({**CAUSES, ("DEGRADED", "HEALTHY"): None}), "any cause may take health DEGRADED -> HEALTHY"),
    (table({k: v for k, v in CAUSES.items() if k != ("RELEASED", "HEALTHY")}),
     "any cause may take health RELEASED -> HEALTHY"),
    (table({**CAUSES, ("FAULTED", "HEALTHY"): ["recover", "reset"]}), "may be taken by ['reset']"),
    (table(extra_pairs=(("REMOVED", "HEALTHY"),)), "REMOVED -> HEALTHY is listed"),
], ids=["any-cause-on-recover-move", "any-cause-on-release-move", "an-extra-kind", "out-of-removed"])
def test_a_table_allowing_more_causes_than_the_spec_is_a_violation(published, expected):
    published = {**published}
    for view in published["views"].values():  # None stands for "causes absent"
        for move in view["transitions"]:
            if move.get("causes", []) is None:
                del move["causes"]
    checker = TransitionChecker(published)
    assert any(expected in v for v in checker.violations), checker.violations
    with pytest.raises(AssertionError, match="published table"):
        checker.assert_clean()


def test_a_table_may_restrict_more_than_the_spec():
    assert TransitionChecker(table({**CAUSES, ("HEALTHY", "ALLOCATED"): ["allocate"]})).violations == []


@pytest.mark.parametrize("causes", [[], "recover", [""], [3]])
def test_malformed_published_causes_are_refused(causes):
    broken = table()
    broken["views"]["health"]["transitions"][5]["causes"] = causes
    with pytest.raises(PublishedTableError, match="causes"):
        TransitionChecker(broken)


# -- cause kinds of events ----------------------------------------------------------------------

@pytest.mark.parametrize(("stream", "expected"), [
    (Stream().degraded().move("DEGRADED", "HEALTHY", "aer:decayed"), "cause kind 'aer' may not take it"),
    (Stream().move("DISCOVERED", "HEALTHY", "hot_add:boot").move("HEALTHY", "ALLOCATED", "allocate:L1")
     .move("ALLOCATED", "RELEASED", "release:L1").move("RELEASED", "HEALTHY", "release:L1"),
     "cause kind 'release' may not take it"),
    (Stream().degraded().move("DEGRADED", "HEALTHY", "recovered"), "cause kind 'recovered' may not"),
], ids=["decay", "release-without-checkpoint", "kind-is-not-a-prefix"])
def test_a_way_back_to_healthy_by_another_cause_is_a_violation(stream, expected):
    assert found(judged(stream), expected)


def test_the_ways_back_the_spec_allows_pass():
    stream = (Stream().move("DISCOVERED", "HEALTHY", "hot_add:boot")
              .move("HEALTHY", "ALLOCATED", "allocate:L1").move("ALLOCATED", "RELEASED", "lease_expired")
              .move("RELEASED", "HEALTHY", "release_checkpoint:lease_expired")
              .move("HEALTHY", "DEGRADED", "aer:recovered_nonfatal").recovered())
    checker = judged(stream)
    assert checker.violations == []
    checker.assert_clean()


def test_a_cause_the_published_table_does_not_list_is_a_violation():
    narrow = table({**CAUSES, ("HEALTHY", "ALLOCATED"): ["allocate"]})
    stream = Stream().move("DISCOVERED", "HEALTHY", "hot_add:boot").move("HEALTHY", "ALLOCATED", "grab:L1")
    assert found(judged(stream, published=narrow), "not one the published table lets take it")


# -- a recover cause needs an open recover run --------------------------------------------------

@pytest.mark.parametrize(("stream", "expected"), [
    (Stream().degraded().move("DEGRADED", "HEALTHY", "recover"), "no recover run of 0000:01:00.0 is open"),
    (Stream().degraded().step("begin").step("end").move("DEGRADED", "HEALTHY", "recover"),
     "no recover run of 0000:01:00.0 is open"),
    (Stream().degraded().degraded(OTHER).step("begin", device=OTHER).move("DEGRADED", "HEALTHY", "recover"),
     "no recover run of 0000:01:00.0 is open"),
    (Stream().degraded().step("begin", run="reset-1", procedure="reset")
     .move("DEGRADED", "HEALTHY", "recover"),
     "no recover run of 0000:01:00.0 is open"),
], ids=["no-run", "run-ended", "another-devices-run", "another-procedure"])
def test_a_recover_cause_outside_the_devices_recover_run_is_a_violation(stream, expected):
    assert found(judged(stream), expected)


def test_a_partial_stream_waits_for_the_run_it_did_not_see_begin():
    # the stream starts inside a recover run: its end proves the run was open
    stream = Stream(seq=40).move("DEGRADED", "HEALTHY", "recover").step("end", run="recover-7")
    assert judged(stream, complete=False).violations == []
    # a step of the run before the move proves it as well
    stream = Stream(seq=40).step("reset", run="recover-7").move("FAULTED", "HEALTHY", "recover")
    assert judged(stream, complete=False).violations == []


@pytest.mark.parametrize(("tail", "when", "expected"), [
    (lambda s: s.step("begin", run="recover-9").step("end", run="recover-9"), "fed",
     "its next run, recover-9, began after it"),
    (lambda s: s.other(), "finished", "no step of one came before the stream ended"),
], ids=["a-later-run-begins", "nothing-follows"])
def test_a_partial_stream_catches_a_recover_no_run_supports(tail, when, expected):
    stream = tail(Stream(seq=40).move("HEALTHY", "DEGRADED", "aer:recovered_nonfatal")
                  .move("DEGRADED", "HEALTHY", "recover"))
    checker = TransitionChecker(table(), complete_history=False)
    checker.feed_all(stream.events)
    assert found(checker, expected) == (when == "fed"), checker.violations
    checker.finish()
    assert found(checker, expected), checker.violations


# -- gaps in seq --------------------------------------------------------------------------------

def test_a_gap_resets_continuity_instead_of_reading_as_a_violation():
    # DEGRADED -> HEALTHY (recover) and HEALTHY -> ALLOCATED fell into the gap
    stream = Stream().degraded().skip(5).move("ALLOCATED", "RELEASED", "release:L1").other()
    checker = judged(stream)
    assert checker.violations == [] and checker.gaps == [(3, 7)]
    assert "seq gaps" in checker.summary()
    # without the gap the same moves are a discontinuity
    assert found(judged(Stream().degraded().move("ALLOCATED", "RELEASED", "release:L1")), "discontinuous")


def test_a_gap_forgets_the_open_runs_and_a_pending_claim():
    # the run's begin was dropped: its end later proves it
    stream = Stream().degraded().skip(1).move("DEGRADED", "HEALTHY", "recover").step("end")
    assert judged(stream).violations == []
    # a claim pending when events go missing is believed (its run's steps may be in the gap)
    stream = Stream(seq=10).move("DEGRADED", "HEALTHY", "recover").skip(3).other()
    assert judged(stream, complete=False).violations == []
    # before any gap, a complete history knows no run was open
    assert found(judged(Stream().degraded().move("DEGRADED", "HEALTHY", "recover")), "is open")


def test_after_a_gap_a_complete_history_no_longer_asks_for_initial_states():
    stream = Stream().degraded().skip(4).move("HEALTHY", "ALLOCATED", "allocate:L1", device=OTHER)
    assert judged(stream).violations == []
    assert found(judged(Stream().degraded().move("HEALTHY", "ALLOCATED", "allocate:L1", device=OTHER)),
                 "not at the initial state")


def test_a_dropped_event_replayed_late_is_skipped_not_out_of_order():
    full = Stream().degraded().recovered()
    late = full.events[3]  # the recover's transition, dropped, then replayed after a re-subscribe
    checker = TransitionChecker(table(), complete_history=True)
    checker.feed_all(full.events[:3] + full.events[4:])
    checker.feed(late)
    checker.finish()
    assert checker.violations == [] and checker.gaps == [(4, 4)]


# -- the rules file -----------------------------------------------------------------------------

def test_the_spec_rules_restrict_the_ways_back_to_healthy():
    rules = spec_rules()
    assert rules.allowed("health", "DEGRADED", "HEALTHY").causes == {"recover"}
    assert rules.allowed("health", "FAULTED", "HEALTHY").causes == {"recover"}
    assert rules.allowed("health", "RELEASED", "HEALTHY").causes == {"release_checkpoint"}
    assert rules.allowed("health", "REMOVED", "DISCOVERED").causes == frozenset()
    assert rules.allowed("health", "HEALTHY", "ALLOCATED") is None
    assert rules.operations == {"recover": "recover"}


GOOD = {"version": 1, "move": [{"view": "health", "from": "A", "to": "B", "causes": ["x"], "why": "w"}],
        "operations": {"x": "x"}}


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(extra=1), "unknown key 'extra'"),
    (lambda d: d["move"][0].update(cause=["x"]), "unknown key 'cause'"),
    (lambda d: d["move"][0].pop("why"), "'why' missing"),
    (lambda d: d["move"][0].update(causes="x"), "expected a list"),
    (lambda d: d["move"][0].update(causes=["x:y"]), "cause kinds"),
    (lambda d: d.update(version=2), "version must be 1"),
    (lambda d: d["operations"].update(y=""), "not kind = procedure"),
])
def test_the_rules_are_read_strictly(change, message):
    data = copy.deepcopy(GOOD)
    TransitionRules.parse(data)
    change(data)
    with pytest.raises(RulesError, match=message):
        TransitionRules.parse(data)
