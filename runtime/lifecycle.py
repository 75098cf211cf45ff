"""The lifecycle state machine, driven by the data in transitions.toml.

Why data: the same table is enforced here, published over the protocol and
rendered in docs/lifecycle.md, so the suites check against exactly what the
runtime enforces. An illegal move (a pair not listed, or a cause whose kind the
table does not allow on a restricted move) raises IllegalTransition and is never
emitted. The table is read strictly: a key this module does not know is an
error, so a table that means more than the runtime enforces cannot load.
"""

from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass

TABLE_PATH = os.path.join(os.path.dirname(__file__), "transitions.toml")
VIEWS = ("health", "main")
TABLE_KEYS = {"version", "severity", "views", "combination"}
VIEW_KEYS = {"initial", "states", "terminal", "any_to", "transitions", "causes"}


class IllegalTransition(RuntimeError):
    """A move not in the table (a runtime bug: callers must not emit it)."""


@dataclass(frozen=True)
class Transition:
    device: str
    view: str
    frm: str
    to: str
    cause: str
    checkpoint: dict
    ts_ns: int

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "view": self.view,
            "from": self.frm,
            "to": self.to,
            "cause": self.cause,
            "checkpoint": self.checkpoint,
            "ts_ns": self.ts_ns,
        }


class TransitionTable:
    """The legal pairs per view (with the causes that may take them), the health severity order
    and the view combination."""

    def __init__(self, data: dict):
        _known_keys("transitions.toml", data, TABLE_KEYS)
        self.version = int(data.get("version", 1))
        self.severity: dict[str, int] = dict(data["severity"])
        self.views: dict[str, dict] = {}
        self._pairs: dict[str, set[tuple[str, str]]] = {}
        self._causes: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {}
        _known_keys("transitions.toml: views", data["views"], set(VIEWS))
        for view in VIEWS:
            spec = data["views"][view]
            _known_keys(f"transitions.toml: {view}", spec, VIEW_KEYS)
            states = list(spec["states"])
            terminal = set(spec.get("terminal", []))
            pairs: set[tuple[str, str]] = set()
            for frm, to in spec.get("transitions", []):
                if frm not in states or to not in states:
                    raise ValueError(f"transitions.toml: {view}: unknown state in {frm}->{to}")
                pairs.add((frm, to))
            for to in spec.get("any_to", []):
                pairs.update((frm, to) for frm in states if frm != to and frm not in terminal)
            self._pairs[view] = pairs
            self._causes[view] = _causes(view, spec.get("causes", {}), pairs)
            self.views[view] = {
                "initial": spec["initial"],
                "states": states,
                "terminal": sorted(terminal),
            }
        self.combination: dict[str, str] = dict(data.get("combination", {}))

    @classmethod
    def load(cls, path: str = TABLE_PATH) -> TransitionTable:
        with open(path, "rb") as fh:
            return cls(tomllib.load(fh))

    def allowed(self, view: str, frm: str, to: str) -> bool:
        return (frm, to) in self._pairs.get(view, ())

    def causes(self, view: str, frm: str, to: str) -> tuple[str, ...] | None:
        """The cause kinds that may take ``frm -> to``; None: any cause."""
        return self._causes.get(view, {}).get((frm, to))

    def check(self, view: str, frm: str, to: str, cause: str | None = None) -> None:
        if not self.allowed(view, frm, to):
            raise IllegalTransition(f"{view}: {frm} -> {to} is not in the transition table")
        allowed = self.causes(view, frm, to)
        if cause is not None and allowed is not None and cause_kind(cause) not in allowed:
            raise IllegalTransition(f"{view}: {frm} -> {to} is taken only by {list(allowed)}, "
                                    f"not by cause {cause!r}")

    def pairs(self, view: str) -> list[tuple[str, str]]:
        order = {s: i for i, s in enumerate(self.views[view]["states"])}
        return sorted(self._pairs[view], key=lambda p: (order[p[0]], order[p[1]]))

    def initial(self, view: str) -> str:
        return self.views[view]["initial"]

    def rank(self, state: str) -> int:
        """Health severity; terminal states (REMOVED) outrank every health."""
        return self.severity.get(state, max(self.severity.values()) + 1)

    def worse(self, *states: str) -> str:
        """The worst of ``states`` (FAULTED > DEGRADED > HEALTHY); ties keep the first."""
        best = states[0]
        for state in states[1:]:
            if self.rank(state) > self.rank(best):
                best = state
        return best

    def main_for(self, frm: str, to: str) -> str | None:
        """The main-view state that accompanies health ``frm -> to``, if any."""
        for key in (f"{frm}>{to}", f"*>{to}"):
            if key in self.combination:
                return self.combination[key]
        return None

    def to_dict(self) -> dict:
        """The published form: explicit pairs, no shorthand."""
        return {
            "version": self.version,
            "severity": dict(self.severity),
            "views": {
                view: {
                    **self.views[view],
                    "transitions": [self._published_pair(view, f, t) for f, t in self.pairs(view)],
                }
                for view in VIEWS
            },
            "combination": dict(self.combination),
        }

    def _published_pair(self, view: str, frm: str, to: str) -> dict:
        """One published move; `causes` only where the table restricts it (absent: any cause)."""
        allowed = self.causes(view, frm, to)
        return {"from": frm, "to": to, **({"causes": list(allowed)} if allowed is not None else {})}


def cause_kind(cause: str) -> str:
    """A cause's kind: its text before the first ':' (``release:L3`` is a ``release``)."""
    return cause.split(":", 1)[0]


def _known_keys(where: str, table: dict, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(known)})")


def _causes(view: str, table: dict, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """The ``causes`` table of a view: "FROM>TO" of a listed move -> a non-empty list of cause kinds."""
    found = {}
    for key, kinds in table.items():
        frm, _, to = key.partition(">")
        if (frm, to) not in pairs:
            raise ValueError(f"transitions.toml: {view}: causes for {key!r}, which is not a listed move")
        if (not isinstance(kinds, list) or not kinds
                or not all(isinstance(k, str) and k and ":" not in k for k in kinds)):
            raise ValueError(f"transitions.toml: {view}: causes for {key!r} must be a non-empty list "
                             f"of cause kinds (no ':'), got {kinds!r}")
        found[(frm, to)] = tuple(kinds)
    return found


class DeviceStates:
    """One device's position in both views; every move is validated first."""

    def __init__(self, table: TransitionTable, device: str):
        self.table = table
        self.device = device
        self.health = table.initial("health")
        self.main = table.initial("main")

    def move(self, view: str, to: str, cause: str, checkpoint: dict, ts_ns: int | None = None) -> Transition:
        frm = self.health if view == "health" else self.main
        self.table.check(view, frm, to, cause)
        if view == "health":
            self.health = to
        else:
            self.main = to
        return Transition(self.device, view, frm, to, cause, checkpoint, ts_ns or time.monotonic_ns())

    def move_health(self, to: str, cause: str, checkpoint: dict) -> list[Transition]:
        """Health move plus the main-view move the table combines with it (if legal now)."""
        frm = self.health
        done = [self.move("health", to, cause, checkpoint)]
        main_to = self.table.main_for(frm, to)
        if main_to and main_to != self.main and self.table.allowed("main", self.main, main_to):
            done.append(self.move("main", main_to, cause, checkpoint))
        return done


def render_markdown(table: TransitionTable) -> str:
    """The generated part of docs/lifecycle.md (a unit test keeps the doc in step with the TOML)."""
    data = table.to_dict()
    lines = [f"Table version {data['version']}.", ""]
    for view in VIEWS:
        spec = data["views"][view]
        restricted = any("causes" in t for t in spec["transitions"])
        lines += [f"### View `{view}` (initial state `{spec['initial']}`)", ""]
        if restricted:
            lines += ["| from | to | causes (kinds) |", "|---|---|---|"]
            lines += [f"| {t['from']} | {t['to']} | {_kinds(t)} |" for t in spec["transitions"]]
        else:
            lines += ["| from | to |", "|---|---|"]
            lines += [f"| {t['from']} | {t['to']} |" for t in spec["transitions"]]
        lines.append("")
    lines += ["### Health severity (worse wins)", "", "| state | rank |", "|---|---|"]
    lines += [f"| {state} | {rank} |" for state, rank in data["severity"].items()]
    lines += ["| REMOVED | terminal (outranks all) |", "", "### Combination: health move → main move", ""]
    lines += ["| health move | main state |", "|---|---|"]
    lines += [f"| `{key}` | {main} |" for key, main in data["combination"].items()]
    return "\n".join(lines) + "\n"


def _kinds(published: dict) -> str:
    return ", ".join(f"`{k}`" for k in published["causes"]) if "causes" in published else "any"


if __name__ == "__main__":
    print(render_markdown(TransitionTable.load()), end="")
