"""fixtures/preconditions.py: a hold ends on the runtime's event or at its deadline, and a missed
precondition is inconclusive (never a failure), recorded for the certificate."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from hilconform.fixtures.errors import Inconclusive
from hilconform.fixtures.preconditions import RELEASED_BY_DEADLINE, RELEASED_BY_EVENT, Preconditions


class FakeRuntime:
    """Answers the hold's wait with `event` once `arrive` is set, or None at the deadline."""

    def __init__(self, event=None):
        self.event = event
        self.arrive = threading.Event()
        self.asked = []

    def event_or_none(self, name, after, timeout_s, match=None):
        self.asked.append((name, after, timeout_s))
        if self.event is not None and self.arrive.wait(timeout_s) and match(self.event["data"]):
            return self.event
        return None


class Item:
    nodeid = "suites/x/test_x.py::test_x"

    def __init__(self):
        self.user_properties, self.sections = [], []
        self.config = SimpleNamespace(workerinput={"workerid": "gw0"})

    def add_report_section(self, when, key, content):
        self.sections.append((when, key, content))


def _hold(pre, runtime, released, deadline_s=5.0):
    return pre.hold("read", "a read in flight", runtime, "procedure", 3,
                    lambda d: d["step"] == "isolate", "isolate",
                    lambda: released.append(time.monotonic_ns()) or released[-1], deadline_s)


def test_a_hold_ends_when_the_runtime_acts_and_is_recorded_met(tmp_path):
    runtime = FakeRuntime({"seq": 9, "data": {"step": "isolate"}})
    pre, released = Preconditions(Item(), tmp_path, "HP-02"), []
    hold = _hold(pre, runtime, released)
    time.sleep(0.05)
    assert not released  # still held: the runtime has not acted
    runtime.arrive.set()
    record = hold.wait(5)
    assert record.released_by == RELEASED_BY_EVENT and record.event["seq"] == 9
    assert record.released_ns == released[0] and record.held_ms >= 50
    pre.met(record, "drain polled twice")
    saved = json.loads(next((tmp_path / "preconditions").glob("*.json")).read_text())
    assert saved["clause"] == "HP-02" and saved["met"] is True and saved["event_seq"] == 9
    assert runtime.asked == [("procedure", 3, 5.0)]


def test_no_event_releases_at_the_deadline_and_a_miss_is_inconclusive_not_a_failure(tmp_path):
    item = Item()
    pre, released = Preconditions(item, tmp_path, "HP-03"), []
    record = _hold(pre, FakeRuntime(), released, deadline_s=0.05).wait(5)
    assert record.released_by == RELEASED_BY_DEADLINE and released
    with pytest.raises(Inconclusive) as caught:
        pre.missed(record, "released before the drain's window was out")
    assert not isinstance(caught.value, AssertionError)
    assert "HP-03 precondition missed" in str(caught.value)
    assert json.loads(next((tmp_path / "preconditions").glob("*.json")).read_text())["met"] is False
    assert item.user_properties[0][0] == "precondition:read"


def test_a_release_that_raises_reaches_the_test(tmp_path):
    def broken():
        raise RuntimeError("backend gone")

    pre = Preconditions(Item(), None, "HP-02")
    hold = pre.hold("read", "x", FakeRuntime(), "procedure", 0, lambda d: True, "x", broken, 0.01)
    with pytest.raises(RuntimeError, match="backend gone"):
        hold.wait(5)


def test_an_observed_precondition_not_in_place_is_inconclusive(tmp_path):
    pre = Preconditions(Item(), tmp_path, "LIFE-04")
    assert pre.observed("renewal", "sent in time", True).met is True
    with pytest.raises(Inconclusive, match="sent only 10 ms"):
        pre.observed("renewal", "sent in time", False, "sent only 10 ms before it")


def test_a_release_after_a_delay_waits_from_the_event_then_releases():
    from hilconform.fixtures.preconditions import after

    released = []
    later = after(0.05, lambda: released.append(time.monotonic_ns()) or 7)
    start = time.monotonic_ns()
    assert later() == 7 and (released[0] - start) / 1e6 >= 50
