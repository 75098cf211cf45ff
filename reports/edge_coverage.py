"""The edge-coverage table: every edge (view, from, to) of the runtime's published transition
table, and every cause kind of a move the table restricts, with the suite tests that walk it;
and the repeats that matter, with theirs. Written to docs/edge-coverage.md.

Why: "every path of a clause walked" (DESIGN.md) is measured from the data, not from a list kept
by hand: the edges are those the runtime publishes (runtime/transitions.toml expanded by the
runtime's own loader, `any_to` as explicit pairs, exactly what its `transitions` method
answers), the walks are the suites' `walks` markers (fixtures/walks.py, read from the test files
by `ast`, no VM, no import of a suite), and each marker is proven at run time by the walk check
(fixtures/walks_check.py). An edge no test walks is a gap: `gaps()` names it, the unit test
(tests/unit/test_edge_coverage.py, in `make test`) fails, and so does `--check`. The only other
way out is an entry in reports/edge_coverage.toml saying why the emulated host cannot drive the
edge, shown in the table next to it.

The data file (reports/edge_coverage.toml) is read strictly: an unknown key, an edge the table
does not have, a reason for an edge some test walks after all, a repeat naming a test that does
not exist or that does not declare the repeat's path, are errors.

    python -m hilconform.reports.edge_coverage           # rewrite docs/edge-coverage.md
    python -m hilconform.reports.edge_coverage --check   # exit 1: stale doc or a gap
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hilconform.fixtures.errors import BadInput
from hilconform.fixtures.walks import MARKER, Edge, Walk, WalkSyntaxError, parse
from hilconform.runtime.lifecycle import TransitionTable

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "reports" / "edge_coverage.toml"
DOC = ROOT / "docs" / "edge-coverage.md"
SUITES = ROOT / "suites"
DATA_KEYS = {"undeclared", "repeat"}
UNDECLARED_KEYS = {"edge", "why"}
REPEAT_KEYS = {"name", "why", "tests", "path", "untested"}


class CoverageDataError(BadInput):
    """reports/edge_coverage.toml, or a `walks` marker, says something the table or suites deny."""


@dataclass(frozen=True)
class Row:
    """One line of the table: an edge, with the cause kind where the table restricts the move."""

    view: str
    frm: str
    to: str
    cause: str | None  # a restricted move's cause kind; None: the move takes any cause

    @property
    def name(self) -> str:
        return str(Edge(self.view, self.frm, self.to, self.cause))


@dataclass(frozen=True)
class Repeat:
    name: str
    why: str
    tests: tuple[str, ...]
    path: Walk | None
    untested: str | None  # why no test walks it yet (shown in the table); None: its tests walk it


@dataclass
class Coverage:
    rows: list[Row]
    walked_by: dict[Row, list[str]]
    undeclared: dict[Row, str]
    repeats: list[Repeat]

    def gaps(self) -> list[str]:
        """Every edge and repeat with no test and no reason: what `make test` fails on."""
        found = [f"edge {r.name}: no test walks it" for r in self.rows
                 if not self.walked_by[r] and r not in self.undeclared]
        return found + [f"repeat {r.name!r}: no test" for r in self.repeats if not r.tests and not r.untested]


# -- reading ------------------------------------------------------------------------------------
def table_rows(published: dict) -> list[Row]:
    """The rows of a published table (the `transitions` method's answer), in its order."""
    rows = []
    for view, spec in published["views"].items():
        for move in spec["transitions"]:
            for cause in move.get("causes") or [None]:
                rows.append(Row(view, move["from"], move["to"], cause))
    return rows


def suite_walks(suites: Path = SUITES) -> dict[str, list[Walk]]:
    """Each suite test's declared walks (its own `walks` marks and its module's `pytestmark`),
    by node id relative to the repository root; read with `ast`, nothing imported."""
    found: dict[str, list[Walk]] = {}
    for path in sorted(suites.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        module_marks = [m for node in tree.body if isinstance(node, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
                        for m in _marks(node.value)]
        rel = path.relative_to(ROOT).as_posix()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                marks = [m for d in node.decorator_list for m in _marks(d)] + module_marks
                found[f"{rel}::{node.name}"] = [_walk(rel, node.name, m) for m in marks]
    return found


def _marks(node: ast.AST) -> list[ast.Call]:
    """The `pytest.mark.walks(...)` calls in a decorator or a pytestmark value."""
    items = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
    return [i for i in items if isinstance(i, ast.Call) and isinstance(i.func, ast.Attribute)
            and i.func.attr == MARKER and isinstance(i.func.value, ast.Attribute)
            and i.func.value.attr == "mark"]


def _walk(rel: str, test: str, call: ast.Call) -> Walk:
    if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Constant):
        raise CoverageDataError(f"{rel}::{test} line {call.lineno}: walks takes one literal path string")
    try:
        return parse(call.args[0].value)
    except WalkSyntaxError as exc:
        raise CoverageDataError(f"{rel}::{test}: {exc}") from None


def _strict(where: str, table: dict, known: set[str], required: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise CoverageDataError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(known)})")
    absent = sorted(required - set(table))
    if absent:
        raise CoverageDataError(f"{where}: missing key {absent[0]!r}")


def row_of(rows: list[Row], edge: Edge, where: str) -> Row:
    """The table row an edge names: a restricted move must name one of its cause kinds."""
    same = [r for r in rows if (r.view, r.frm, r.to) == (edge.view, edge.frm, edge.to)]
    if not same:
        raise CoverageDataError(f"{where}: {edge.view}: {edge.frm} > {edge.to} is not in the published table")
    if same[0].cause is None:
        return same[0]
    named = [r for r in same if r.cause == edge.cause]
    if not named:
        raise CoverageDataError(f"{where}: {edge.view}: {edge.frm} > {edge.to} is taken only by "
                                f"{[r.cause for r in same]}: name one (`{edge.to}@{same[0].cause}`)")
    return named[0]


def contains(outer: Walk, inner: Walk) -> bool:
    """Whether `inner`'s moves are a consecutive stretch of `outer`'s (a cause `inner` names must
    be named the same in `outer`)."""
    n = len(inner.edges)
    return outer.view == inner.view and any(
        all(_covers(outer.edges[s + i], e) for i, e in enumerate(inner.edges))
        for s in range(len(outer.edges) - n + 1))


def _covers(declared: Edge, wanted: Edge) -> bool:
    return (declared.frm, declared.to) == (wanted.frm, wanted.to) and wanted.cause in (None, declared.cause)


def coverage(published: dict | None = None, data_path: Path = DATA, suites: Path = SUITES) -> Coverage:
    """The whole table, checked: CoverageDataError for anything the data or a marker gets wrong."""
    rows = table_rows(published or TransitionTable.load().to_dict())
    walks = suite_walks(suites)
    walked_by: dict[Row, list[str]] = {r: [] for r in rows}
    for test, declared in walks.items():
        for walk in declared:
            for edge in walk.edges:
                row = row_of(rows, edge, f"{test}: walks({walk.text!r})")
                if test not in walked_by[row]:
                    walked_by[row].append(test)
    with open(data_path, "rb") as fh:
        data = tomllib.load(fh)
    _strict(data_path.name, data, DATA_KEYS, set())
    undeclared: dict[Row, str] = {}
    for i, entry in enumerate(data.get("undeclared", [])):
        where = f"{data_path.name}: undeclared[{i}]"
        _strict(where, entry, UNDECLARED_KEYS, UNDECLARED_KEYS)
        try:
            walk = parse(f"{entry['edge']}")
        except WalkSyntaxError as exc:
            raise CoverageDataError(f"{where}: {exc}") from None
        if len(walk.edges) != 1:
            raise CoverageDataError(f"{where}: one edge per entry, got {entry['edge']!r}")
        row = row_of(rows, walk.edges[0], where)
        if walked_by[row]:
            raise CoverageDataError(f"{where}: {row.name} is walked by {walked_by[row]}: drop its reason")
        undeclared[row] = str(entry["why"])
    repeats = [_repeat(data_path.name, i, entry, walks, rows)
               for i, entry in enumerate(data.get("repeat", []))]
    return Coverage(rows, walked_by, undeclared, repeats)


def _repeat(file: str, i: int, entry: dict, walks: dict[str, list[Walk]], rows: list[Row]) -> Repeat:
    where = f"{file}: repeat[{i}] {entry.get('name', '')!r}"
    _strict(where, entry, REPEAT_KEYS, {"name", "why", "tests"})
    path = None
    if "path" in entry:
        try:
            path = parse(entry["path"])
        except WalkSyntaxError as exc:
            raise CoverageDataError(f"{where}: {exc}") from None
        for edge in path.edges:
            row_of(rows, edge, where)
    for test in entry["tests"]:
        if test not in walks:
            raise CoverageDataError(f"{where}: no suite test {test!r}")
        if path is not None and not any(contains(w, path) for w in walks[test]):
            raise CoverageDataError(f"{where}: {test} declares no walks marker holding {path.text!r} "
                                    "(the walk check proves a repeat's path only through one)")
    if entry.get("untested") and entry["tests"]:
        raise CoverageDataError(f"{where}: has tests {entry['tests']}: drop its `untested` reason")
    return Repeat(str(entry["name"]), str(entry["why"]), tuple(entry["tests"]), path, entry.get("untested"))


# -- writing ------------------------------------------------------------------------------------
def render(cov: Coverage) -> str:
    lines = ["# Edge coverage", "",
             "<!-- Generated by `python -m hilconform.reports.edge_coverage` (make edge-coverage) from the "
             "runtime's published transition table (runtime/transitions.toml), the suites' `walks` markers "
             "and reports/edge_coverage.toml. Do not edit: tests/unit/test_edge_coverage.py fails when this "
             "file is not what the generator writes. -->", "",
             "Every edge of the transition table the runtime publishes (`any_to` expanded), and every cause "
             "kind of a move the table restricts, with the suite tests whose `walks` marker declares it "
             "(fixtures/walks.py). Each declaration is proven when the test runs: the runtime must make "
             "those moves in the test's window, or the test fails (fixtures/walks_check.py). An edge the "
             "emulated host cannot drive says why; an edge with neither is a gap, and `make test` fails.",
             ""]
    for view in dict.fromkeys(r.view for r in cov.rows):
        lines += [f"## View `{view}`", "", "| from | to | cause | walked by |", "|---|---|---|---|"]
        for row in (r for r in cov.rows if r.view == view):
            tests = cov.walked_by[row]
            cell = ("<br>".join(f"`{t}`" for t in tests) if tests
                    else f"no declaring test: {cov.undeclared[row]}" if row in cov.undeclared
                    else "**GAP: no test**")
            lines.append(f"| {row.frm} | {row.to} | {f'`{row.cause}`' if row.cause else 'any'} | {cell} |")
        lines.append("")
    lines += ["## Repeats that matter", "",
              "Operations whose second time, or whose path after a fault, is where a runtime goes wrong. "
              "A repeat with a path is proven through the named tests' `walks` markers.", "",
              "| repeat | why | path | tests |", "|---|---|---|---|"]
    for rep in cov.repeats:
        tests = ("<br>".join(f"`{t}`" for t in rep.tests)
                 or (f"no test: {rep.untested}" if rep.untested else "**GAP: no test**"))
        path = f"`{rep.path.text}`" if rep.path else "-" if rep.untested else "(judged by the test)"
        lines.append(f"| {rep.name} | {rep.why} | {path} | {tests} |")
    walked = sum(1 for r in cov.rows if cov.walked_by[r])
    repeats = sum(1 for r in cov.repeats if r.tests)
    lines += ["", f"{walked} of {len(cov.rows)} rows walked by a test, {len(cov.undeclared)} with no "
              f"declaring test (reason given); {repeats} of {len(cov.repeats)} repeats walked; "
              f"{len(cov.gaps())} gap(s).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hilconform.reports.edge_coverage",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the doc is stale or a gap is left")
    args = parser.parse_args(argv)
    try:
        cov = coverage()
    except CoverageDataError as exc:
        print(f"edge coverage: {exc}", file=sys.stderr)
        return 2
    text = render(cov)
    for gap in cov.gaps():
        print(f"edge coverage: GAP: {gap}", file=sys.stderr)
    if args.check:
        stale = not DOC.is_file() or DOC.read_text() != text
        if stale:
            print(f"edge coverage: {DOC.relative_to(ROOT)} is stale: run make edge-coverage", file=sys.stderr)
        return 1 if stale or cov.gaps() else 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 1 if cov.gaps() else 0


if __name__ == "__main__":
    sys.exit(main())
