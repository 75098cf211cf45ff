"""The transition table (LIFE-01): every listed move legal, all others refused, worse health wins."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from hilconform.runtime.lifecycle import DeviceStates, IllegalTransition, TransitionTable, render_markdown

TABLE = TransitionTable.load()

# The clause's moves (docs/spec.md, "Runtime states"), which the table must contain.
CLAUSE_HEALTH = [
    ("DISCOVERED", "HEALTHY"),
    ("HEALTHY", "ALLOCATED"),
    ("ALLOCATED", "RELEASED"),
    ("RELEASED", "HEALTHY"),
    ("HEALTHY", "DEGRADED"),
    ("DEGRADED", "HEALTHY"),
    ("DEGRADED", "FAULTED"),
]
CLAUSE_MAIN = [
    ("POWER_OFF", "FIRMWARE_LOADED"),
    ("FIRMWARE_LOADED", "INITIALIZED"),
    ("INITIALIZED", "ALLOCATED"),
    ("ALLOCATED", "RUNNING"),
]


@pytest.mark.parametrize(("frm", "to"), CLAUSE_HEALTH)
def test_clause_health_moves_are_legal(frm, to):
    assert TABLE.allowed("health", frm, to)


@pytest.mark.parametrize(("frm", "to"), CLAUSE_MAIN)
def test_clause_main_path_is_legal(frm, to):
    assert TABLE.allowed("main", frm, to)


def test_error_reachable_from_every_main_state():
    for state in TABLE.views["main"]["states"]:
        if state != "ERROR":
            assert TABLE.allowed("main", state, "ERROR"), state


def test_removed_reachable_from_every_health_state_and_terminal():
    states = TABLE.views["health"]["states"]
    for state in states:
        if state != "REMOVED":
            assert TABLE.allowed("health", state, "REMOVED"), state
    assert not any(TABLE.allowed("health", "REMOVED", s) for s in states)


@pytest.mark.parametrize("view", ["health", "main"])
def test_every_pair_not_published_is_refused(view):
    published = {(t["from"], t["to"]): t.get("causes", ["test"])
                 for t in TABLE.to_dict()["views"][view]["transitions"]}
    states = TABLE.views[view]["states"]
    for frm, to in itertools.product(states, states):
        cell = DeviceStates(TABLE, "0000:01:00.0")
        setattr(cell, "health" if view == "health" else "main", frm)
        if (frm, to) in published:
            t = cell.move(view, to, published[(frm, to)][0], {"name": "t", "ok": True})
            assert (t.frm, t.to) == (frm, to)
        else:
            with pytest.raises(IllegalTransition):
                cell.move(view, to, "test", {"name": "t", "ok": True})
            assert getattr(cell, "health" if view == "health" else "main") == frm  # unchanged


def test_no_self_loops_and_no_shortcuts_past_the_self_check():
    for view in ("health", "main"):
        for state in TABLE.views[view]["states"]:
            assert not TABLE.allowed(view, state, state)
    assert not TABLE.allowed("health", "DISCOVERED", "ALLOCATED")
    assert not TABLE.allowed("health", "FAULTED", "ALLOCATED")
    assert not TABLE.allowed("main", "POWER_OFF", "RUNNING")


def test_worse_health_wins():
    assert TABLE.worse("HEALTHY", "DEGRADED") == "DEGRADED"
    assert TABLE.worse("FAULTED", "HEALTHY", "DEGRADED") == "FAULTED"
    assert TABLE.worse("DEGRADED", "HEALTHY") == "DEGRADED"
    assert TABLE.worse("ALLOCATED", "DEGRADED") == "DEGRADED"
    assert TABLE.rank("REMOVED") > TABLE.rank("FAULTED")


def test_health_move_carries_its_main_move():
    cell = DeviceStates(TABLE, "0000:01:00.0")
    cell.move("main", "FIRMWARE_LOADED", "fw", {"name": "fw", "ok": True})
    moves = cell.move_health("HEALTHY", "hot_add", {"name": "config_intact", "ok": True})
    assert [(m.view, m.frm, m.to) for m in moves] == [
        ("health", "DISCOVERED", "HEALTHY"),
        ("main", "FIRMWARE_LOADED", "INITIALIZED"),
    ]
    moves = cell.move_health("FAULTED", "aer", {"name": "aer", "ok": False})
    assert [(m.view, m.to) for m in moves] == [("health", "FAULTED"), ("main", "ERROR")]
    event = moves[0].to_dict()
    assert set(event) == {"device", "view", "from", "to", "cause", "checkpoint", "ts_ns"}
    assert event["ts_ns"] > 0


def test_published_table_is_explicit_and_self_consistent():
    published = TABLE.to_dict()
    for view in ("health", "main"):
        spec = published["views"][view]
        assert spec["initial"] in spec["states"]
        for t in spec["transitions"]:
            assert t["from"] in spec["states"] and t["to"] in spec["states"]
    for key, main in published["combination"].items():
        frm, to = key.split(">")
        assert to in published["views"]["health"]["states"]
        assert main in published["views"]["main"]["states"]


def test_docs_lifecycle_md_matches_the_table():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "lifecycle.md").read_text()
    marker = "<!-- generated: python3 -m hilconform.runtime.lifecycle -->\n"
    assert marker in doc
    assert doc.split(marker, 1)[1] == render_markdown(TABLE), "regenerate docs/lifecycle.md"


# -- causes (LIFE-01: the ways back to HEALTHY) ---------------------------------------------------

def _raw() -> dict:
    import tomllib

    from hilconform.runtime.lifecycle import TABLE_PATH

    with open(TABLE_PATH, "rb") as fh:
        return tomllib.load(fh)


def test_the_ways_back_to_healthy_are_restricted_to_recover_and_the_release_checkpoint():
    assert TABLE.causes("health", "DEGRADED", "HEALTHY") == ("recover",)
    assert TABLE.causes("health", "FAULTED", "HEALTHY") == ("recover",)
    assert TABLE.causes("health", "RELEASED", "HEALTHY") == ("release_checkpoint",)
    assert TABLE.causes("health", "HEALTHY", "ALLOCATED") is None
    health = TABLE.to_dict()["views"]["health"]["transitions"]
    published = {(t["from"], t["to"]): t.get("causes") for t in health}
    assert published[("RELEASED", "HEALTHY")] == ["release_checkpoint"]
    assert published[("HEALTHY", "ALLOCATED")] is None  # absent: any cause


@pytest.mark.parametrize(("frm", "cause", "legal"), [
    ("DEGRADED", "recover", True),
    ("DEGRADED", "aer:decayed", False),
    ("DEGRADED", "recovered", False),  # a kind is the text before ':', never a prefix
    ("FAULTED", "recover", True),
    ("FAULTED", "reset:checkpoint", False),
    ("RELEASED", "release_checkpoint:release:L3", True),
    ("RELEASED", "release:L3", False),
    ("RELEASED", "lease_expired", False),
])
def test_a_restricted_move_is_refused_for_any_other_cause(frm, cause, legal):
    cell = DeviceStates(TABLE, "0000:01:00.0")
    cell.health = frm
    if legal:
        assert cell.move("health", "HEALTHY", cause, {"name": "t", "ok": True}).to == "HEALTHY"
    else:
        with pytest.raises(IllegalTransition, match="taken only by"):
            cell.move("health", "HEALTHY", cause, {"name": "t", "ok": True})
        assert cell.health == frm


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["views"]["health"].update(cause={}), "unknown key 'cause'"),
    (lambda d: d["views"].update(power={}), "unknown key 'power'"),
    (lambda d: d["views"]["health"]["causes"].update({"HEALTHY>RELEASED": ["x"]}), "not a listed move"),
    (lambda d: d["views"]["health"]["causes"].update({"DEGRADED>HEALTHY": []}), "non-empty list"),
    (lambda d: d["views"]["health"]["causes"].update({"DEGRADED>HEALTHY": ["recover:x"]}), "no ':'"),
])
def test_the_table_is_read_strictly(change, message):
    data = _raw()
    change(data)
    with pytest.raises(ValueError, match=message):
        TransitionTable(data)
