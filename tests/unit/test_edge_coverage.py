"""Every edge and cause kind of the runtime's published transition table, and every repeat that
matters, is walked by a suite test (or says why not), and docs/edge-coverage.md is what the
generator writes now (reports/edge_coverage.py); the `walks` grammar and the walk check's
matching (fixtures/walks.py, fixtures/walks_check.py). No VM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hilconform.fixtures.walks import WalkSyntaxError, parse
from hilconform.fixtures.walks_check import walked
from hilconform.reports import edge_coverage
from hilconform.reports.edge_coverage import CoverageDataError, coverage, render, table_rows
from hilconform.runtime.lifecycle import TransitionTable

TABLE = TransitionTable.load()


def test_no_edge_cause_or_repeat_is_left_without_a_test():
    gaps = coverage().gaps()
    assert not gaps, ("walk these with a test (a `walks` marker, fixtures/walks.py) or say in "
                      "reports/edge_coverage.toml why the emulated host cannot:\n  " + "\n  ".join(gaps))


def test_the_doc_is_what_the_generator_writes():
    assert edge_coverage.DOC.read_text() == render(coverage()), "run make edge-coverage"


def test_the_rows_are_the_published_pairs_with_any_to_expanded():
    rows = table_rows(TABLE.to_dict())
    for view in ("health", "main"):
        assert {(r.frm, r.to) for r in rows if r.view == view} == set(TABLE.pairs(view))
    assert ("health", "ALLOCATED", "REMOVED", None) in {(r.view, r.frm, r.to, r.cause) for r in rows}
    restricted = {(r.frm, r.to): r.cause for r in rows if r.cause}
    assert restricted == {("DEGRADED", "HEALTHY"): "recover", ("FAULTED", "HEALTHY"): "recover",
                          ("RELEASED", "HEALTHY"): "release_checkpoint"}


def test_a_walk_parses_into_its_consecutive_edges():
    walk = parse("health: ALLOCATED > DEGRADED > HEALTHY@recover")
    assert [(e.frm, e.to, e.cause) for e in walk.edges] == [("ALLOCATED", "DEGRADED", None),
                                                             ("DEGRADED", "HEALTHY", "recover")]


@pytest.mark.parametrize("text", ["HEALTHY > DEGRADED", "health: HEALTHY", "health: HEALTHY@x > DEGRADED",
                                  "health: healthy > DEGRADED", "Health: A > B"])
def test_a_malformed_walk_is_bad_input(text):
    with pytest.raises(WalkSyntaxError):
        parse(text)


def _move(frm, to, cause="c", device="d1", view="health", client=1):
    return {"view": view, "from": frm, "to": to, "cause": cause, "device": device, "client": client}


def test_a_walk_is_seen_only_as_consecutive_moves_of_one_device_with_its_causes():
    walk = parse("health: ALLOCATED > DEGRADED > HEALTHY@recover")
    assert walked(walk, [_move("HEALTHY", "ALLOCATED"), _move("ALLOCATED", "DEGRADED"),
                         _move("DEGRADED", "HEALTHY", "recover:R1")])
    # the move into HEALTHY by another cause, on another device, or with a move between: not it
    assert not walked(walk, [_move("ALLOCATED", "DEGRADED"), _move("DEGRADED", "HEALTHY", "aer:decayed")])
    assert not walked(walk, [_move("ALLOCATED", "DEGRADED"), _move("DEGRADED", "HEALTHY", "recover", "d2")])
    assert not walked(walk, [_move("ALLOCATED", "DEGRADED"), _move("DEGRADED", "FAULTED"),
                             _move("FAULTED", "HEALTHY", "recover")])
    # the other view's moves never count
    assert not walked(parse("main: ALLOCATED > RUNNING"), [_move("ALLOCATED", "RUNNING")])


def _suite(tmp_path: Path, marker: str) -> Path:
    folder = tmp_path / "suites" / "x"
    folder.mkdir(parents=True)
    (folder / "test_x.py").write_text(
        f"import pytest\n\n@pytest.mark.walks({marker!r})\ndef test_x():\n    pass\n")
    return tmp_path / "suites"


def _data(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "edge_coverage.toml"
    path.write_text(text)
    return path


def _coverage(tmp_path, marker, data):
    suites = _suite(tmp_path, marker)
    old = edge_coverage.ROOT
    edge_coverage.ROOT = tmp_path
    try:
        return coverage(TABLE.to_dict(), _data(tmp_path, data), suites)
    finally:
        edge_coverage.ROOT = old


@pytest.mark.parametrize("marker, data, says", [
    ("health: HEALTHY > RUNNING", "", "not in the published table"),
    ("health: DEGRADED > HEALTHY", "", "taken only by ['recover']"),
    ("health: HEALTHY > DEGRADED", "colour = 1\n", "unknown key 'colour'"),
    ("health: HEALTHY > DEGRADED", '[[undeclared]]\nedge = "health: HEALTHY > DEGRADED"\nwhy = "x"\n',
     "drop its reason"),
    ("health: HEALTHY > DEGRADED",
     '[[repeat]]\nname = "r"\nwhy = "w"\ntests = ["suites/x/test_x.py::test_y"]\n', "no suite test"),
    ("health: HEALTHY > DEGRADED", '[[repeat]]\nname = "r"\nwhy = "w"\npath = "health: DEGRADED > FAULTED"\n'
     'tests = ["suites/x/test_x.py::test_x"]\n', "declares no walks marker"),
])
def test_what_the_table_or_the_suites_deny_is_an_error(tmp_path, marker, data, says):
    with pytest.raises(CoverageDataError, match=None) as raised:
        _coverage(tmp_path, marker, data)
    assert says in str(raised.value)


def test_an_edge_with_no_test_and_no_reason_is_a_gap(tmp_path):
    gaps = _coverage(tmp_path, "health: HEALTHY > DEGRADED", "").gaps()
    assert "edge health: HEALTHY > DEGRADED: no test walks it" not in gaps
    assert "edge health: DEGRADED > FAULTED: no test walks it" in gaps
