"""The lifecycle state machine, driven by the data in transitions.toml.

Why data: the same table is enforced here, published over the protocol and
rendered in docs/lifecycle.md, so the suites check against exactly what the
runtime enforces. An illegal move raises IllegalTransition and is never
emitted.
"""

from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass

TABLE_PATH = os.path.join(os.path.dirname(__file__), "transitions.toml")
VIEWS = ("health", "main")


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
    """The legal pairs per view, the health severity order and the view combination."""

    def __init__(self, data: dict):
        self.version = int(data.get("version", 1))
        self.severity: dict[str, int] = dict(data["severity"])
        self.views: dict[str, dict] = {}
        self._pairs: dict[str, set[tuple[str, str]]] = {}
        for view in VIEWS:
            spec = data["views"][view]
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

    def check(self, view: str, frm: str, to: str) -> None:
        if not self.allowed(view, frm, to):
            raise IllegalTransition(f"{view}: {frm} -> {to} is not in the transition table")

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
                    "transitions": [{"from": f, "to": t} for f, t in self.pairs(view)],
                }
                for view in VIEWS
            },
            "combination": dict(self.combination),
        }


class DeviceStates:
    """One device's position in both views; every move is validated first."""

    def __init__(self, table: TransitionTable, device: str):
        self.table = table
        self.device = device
        self.health = table.initial("health")
        self.main = table.initial("main")

    def move(self, view: str, to: str, cause: str, checkpoint: dict, ts_ns: int | None = None) -> Transition:
        frm = self.health if view == "health" else self.main
        self.table.check(view, frm, to)
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
        lines += [f"### View `{view}` (initial state `{spec['initial']}`)", "", "| from | to |", "|---|---|"]
        lines += [f"| {t['from']} | {t['to']} |" for t in spec["transitions"]]
        lines.append("")
    lines += ["### Health severity (worse wins)", "", "| state | rank |", "|---|---|"]
    lines += [f"| {state} | {rank} |" for state, rank in data["severity"].items()]
    lines += ["| REMOVED | terminal (outranks all) |", "", "### Combination: health move → main move", ""]
    lines += ["| health move | main state |", "|---|---|"]
    lines += [f"| `{key}` | {main} |" for key, main in data["combination"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(TransitionTable.load()), end="")
