"""`hilconform report diff RUN_A RUN_B`: which clause verdicts and figures changed between two runs.

Figures are matched by key (clause, figure name, test parameters); a figure
whose median or p95 moved by more than a threshold is listed with both values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hilconform.fixtures.errors import BadInput

from .certificate import SCHEMA_VERSION
from .run_folder import NotARunFolder, RunFolder

RELATIVE_THRESHOLD = 0.10  # a median or p95 that moved by more than 10 % is reported


class IncomparableRuns(BadInput):
    """The two runs' certificates cannot be compared (another schema version)."""


@dataclass
class RunDiff:
    verdict: tuple[str, str]
    clauses: list[tuple[str, str, str]] = field(default_factory=list)  # id, before, after
    figures: list[dict] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(
            self.verdict[0] != self.verdict[1]
            or self.clauses
            or self.figures
            or self.only_in_a
            or self.only_in_b
        )

    def text(self, name_a: str, name_b: str) -> str:
        lines = [
            f"A = {name_a}",
            f"B = {name_b}",
            f"verdict: {self.verdict[0]} -> {self.verdict[1]}"
            if self.verdict[0] != self.verdict[1]
            else f"verdict: {self.verdict[0]} (unchanged)",
        ]
        for clause, before, after in self.clauses:
            lines.append(f"clause {clause}: {before} -> {after}")
        for clause in self.only_in_a:
            lines.append(f"clause {clause}: only in A")
        for clause in self.only_in_b:
            lines.append(f"clause {clause}: only in B")
        for f in self.figures:
            if f.get("only_in"):
                side = 0 if f["only_in"] == "A" else 1
                lines.append(
                    f"figure {f['key']}: only in {f['only_in']} (median {f['median'][side]:g}, "
                    f"p95 {f['p95'][side]:g} {f['unit']})"
                )
                continue
            lines.append(
                f"figure {f['key']}: median {f['median'][0]:g} -> {f['median'][1]:g}, "
                f"p95 {f['p95'][0]:g} -> {f['p95'][1]:g} {f['unit']}"
                + (f" ({f['note']})" if f.get("note") else "")
            )
        if not self.changed:
            lines.append("no clause verdict or figure changed")
        return "\n".join(lines)


def _load(path) -> dict:
    certificate = RunFolder.open(path).read_certificate()
    version = certificate.get("schema_version")
    if version != SCHEMA_VERSION:
        raise IncomparableRuns(
            f"{path}: certificate schema version {version!r}, this hilconform reads "
            f"version {SCHEMA_VERSION}; compare runs of the same version"
        )
    return certificate


def _moved(before: float, after: float) -> bool:
    scale = max(abs(before), abs(after), 1e-9)
    return abs(after - before) / scale > RELATIVE_THRESHOLD


def diff_certificates(a: dict, b: dict) -> RunDiff:
    clauses_a = {c["id"]: c for c in a["clauses"]}
    clauses_b = {c["id"]: c for c in b["clauses"]}
    result = RunDiff((a["verdict"], b["verdict"]))
    for clause in sorted(clauses_a.keys() & clauses_b.keys()):
        if clauses_a[clause]["verdict"] != clauses_b[clause]["verdict"]:
            result.clauses.append((clause, clauses_a[clause]["verdict"], clauses_b[clause]["verdict"]))
    result.only_in_a = sorted(clauses_a.keys() - clauses_b.keys())
    result.only_in_b = sorted(clauses_b.keys() - clauses_a.keys())
    figures_a = {f["key"]: f for c in a["clauses"] for f in c["figures"]}
    figures_b = {f["key"]: f for c in b["clauses"] for f in c["figures"]}
    for key in sorted(figures_a.keys() | figures_b.keys()):
        fa, fb = figures_a.get(key), figures_b.get(key)
        if fa is None or fb is None:
            present = fa or fb
            result.figures.append(
                {
                    "key": key,
                    "unit": present["unit"],
                    "median": (fa["median"] if fa else float("nan"), fb["median"] if fb else float("nan")),
                    "p95": (fa["p95"] if fa else float("nan"), fb["p95"] if fb else float("nan")),
                    "only_in": "A" if fb is None else "B",
                }
            )
        elif _moved(fa["median"], fb["median"]) or _moved(fa["p95"], fb["p95"]):
            note = ""
            if fa["within_budget"] != fb["within_budget"]:
                note = (
                    f"budget {'met' if fa['within_budget'] else 'missed'} -> "
                    f"{'met' if fb['within_budget'] else 'missed'}"
                )
            result.figures.append(
                {
                    "key": key,
                    "unit": fa["unit"],
                    "median": (fa["median"], fb["median"]),
                    "p95": (fa["p95"], fb["p95"]),
                    "note": note,
                }
            )
    return result


def diff_runs(path_a, path_b) -> RunDiff:
    """Raises NotARunFolder or IncomparableRuns with a message naming the folder."""
    return diff_certificates(_load(path_a), _load(path_b))


__all__ = ["IncomparableRuns", "NotARunFolder", "RunDiff", "diff_certificates", "diff_runs"]
