"""Check a runtime's `transition` events against the table it publishes (LIFE-01).

The runtime publishes ONE transition table (protocol method `transitions`,
docs/lifecycle.md); every state change is a `transition` event. This checker
judges a stream of those events against the published table, independently
of the runtime's own code (it only reads the published dict):

* the move is legal in its view (`from -> to` is a listed pair) and names
  states of that view;
* it carries `ts_ns` (an integer), a non-empty `cause` and a `checkpoint`
  (`{name: str, ok: bool, ...}`); a move into HEALTHY or ALLOCATED must have
  passed its checkpoint (`ok: true`);
* per device, timestamps never go backwards and the sequence is continuous:
  each `from` equals the previous `to` of that device in that view (a device
  that reached a terminal state, REMOVED, can only come back as a new record
  starting at the view's initial state);
* the published `combination` holds: a health move that the table pairs with
  a main-view move is followed at once, for that device, by that main move
  (when it is legal from the device's main state);
* with `complete_history=True` (the stream was replayed from the runtime's
  first event) a device's first move starts at the view's initial state.

Events are ordered by their runtime `seq`; an event seen twice (a replay
after a re-subscribe) is checked once. Usage:

    checker = TransitionChecker(runtime.call("transitions"), complete_history=True)
    checker.feed_all(runtime.events(mark, "transition"))
    checker.assert_clean()
    checker.assert_matches_inventory(runtime.call("inventory")["devices"])

Only the standard library: any suite may import it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

HEALTH, MAIN = "health", "main"
# Moves into these health states must have passed a checkpoint (docs/lifecycle.md:
# config_intact runs before every move into HEALTHY or ALLOCATED).
CHECKPOINTED_STATES = frozenset({"HEALTHY", "ALLOCATED"})


class PublishedTableError(ValueError):
    """The runtime's published transition table is malformed."""


@dataclass(frozen=True)
class View:
    name: str
    initial: str
    states: tuple[str, ...]
    terminal: frozenset[str]
    pairs: frozenset[tuple[str, str]]


@dataclass(frozen=True)
class PublishedTable:
    version: int
    views: dict[str, View]
    combination: dict[str, str]

    @classmethod
    def parse(cls, data: dict) -> PublishedTable:
        """Validate and read the `transitions` method's result."""
        try:
            views = {}
            for name, spec in data["views"].items():
                states = tuple(spec["states"])
                pairs = frozenset((t["from"], t["to"]) for t in spec["transitions"])
                unknown = {s for pair in pairs for s in pair} - set(states)
                if unknown or spec["initial"] not in states:
                    raise PublishedTableError(
                        f"view {name!r}: states {sorted(unknown) or [spec['initial']]} not listed in "
                        f"its states {list(states)}")
                views[name] = View(name, spec["initial"], states,
                                   frozenset(spec.get("terminal", ())), pairs)
            combination = dict(data.get("combination", {}))
            version = int(data.get("version", 0))
        except (KeyError, TypeError, AttributeError) as exc:
            raise PublishedTableError(f"published transition table is malformed: {exc!r}") from None
        if not views:
            raise PublishedTableError("published transition table has no views")
        return cls(version, views, combination)

    def allowed(self, view: str, frm: str, to: str) -> bool:
        return view in self.views and (frm, to) in self.views[view].pairs

    def main_for(self, frm: str, to: str) -> str | None:
        """The main-view state that accompanies health `frm -> to` (combination table)."""
        return self.combination.get(f"{frm}>{to}", self.combination.get(f"*>{to}"))


class TransitionChecker:
    """Feeds on `transition` events; collects every violation with the event that caused it."""

    def __init__(self, table: dict | PublishedTable, complete_history: bool = False,
                 checkpointed_states: frozenset[str] = CHECKPOINTED_STATES):
        self.table = table if isinstance(table, PublishedTable) else PublishedTable.parse(table)
        self.complete_history = complete_history
        self.checkpointed_states = checkpointed_states
        self.violations: list[str] = []
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (view, from, to)
        self.checked = 0
        self._position: dict[tuple[str, str], str] = {}  # (device, view) -> state
        self._last_ts: dict[str, int] = {}
        self._ended: set[str] = set()  # devices whose record reached a terminal health state
        self._expect_main: dict[str, tuple[str, str, str]] = {}  # device -> (from, to, why)
        self._seen: dict[int, dict] = {}  # seq -> data
        self._max_seq = 0
        self._combine = HEALTH in self.table.views and MAIN in self.table.views

    # -- feeding --------------------------------------------------------------------------------
    @classmethod
    def for_runtime(cls, runtime, complete_history: bool = False) -> TransitionChecker:
        return cls(runtime.call("transitions"), complete_history=complete_history)

    def feed_all(self, events: Iterable[dict]) -> list[str]:
        """Check a batch (any events; non-transitions are ignored), in runtime `seq` order."""
        batch = [e for e in events if e.get("event") == "transition"]
        batch.sort(key=lambda e: e.get("seq") if isinstance(e.get("seq"), int) else -1)
        found: list[str] = []
        for event in batch:
            found += self.feed(event)
        return found

    def feed(self, event: dict) -> list[str]:
        """Check one `transition` event; returns the violations it caused (also kept)."""
        seq = event.get("seq")
        data = event.get("data")
        where = f"seq {seq}"
        if not isinstance(seq, int):
            return self._bad([f"{where}: event has no integer seq: {event!r:.200}"])
        if seq in self._seen:
            if self._seen[seq] != data:
                return self._bad([f"{where}: seen twice with different data"])
            return []  # a replay of an event already checked
        if seq < self._max_seq:
            return self._bad([f"{where}: arrived after seq {self._max_seq} was checked (out of order)"])
        self._seen[seq] = data
        self._max_seq = seq
        self.checked += 1
        if not isinstance(data, dict):
            return self._bad([f"{where}: transition without a data object"])
        problems = self._shape(data)
        if problems:
            return self._bad([f"{where} {_brief(data)}: {p}" for p in problems])
        device, view, frm, to = data["device"], data["view"], data["from"], data["to"]
        where = f"{where} {device} {view} {frm}->{to} ({data['cause']})"
        self.counts[(view, frm, to)] += 1
        problems += self._legal(view, frm, to, data)
        if view not in self.table.views:
            return self._bad([f"{where}: {p}" for p in problems])
        problems += self._timestamps(device, data["ts_ns"])
        combined, closing = self._combination(device, view, frm, to)
        problems += combined
        problems += self._continuity(device, view, frm, to, closing)
        return self._bad([f"{where}: {p}" for p in problems])

    def _bad(self, problems: list[str]) -> list[str]:
        self.violations += problems
        return problems

    # -- individual checks ----------------------------------------------------------------------
    def _shape(self, data: dict) -> list[str]:
        problems = []
        for key in ("device", "view", "from", "to"):
            if not isinstance(data.get(key), str) or not data.get(key):
                problems.append(f"no {key!r} string")
        if not isinstance(data.get("cause"), str) or not data["cause"].strip():
            problems.append("no cause")
        ts = data.get("ts_ns")
        if not isinstance(ts, int) or isinstance(ts, bool) or ts <= 0:
            problems.append(f"no ts_ns timestamp (got {ts!r})")
        checkpoint = data.get("checkpoint")
        if not isinstance(checkpoint, dict):
            problems.append(f"no checkpoint object (got {checkpoint!r:.80})")
        elif not isinstance(checkpoint.get("name"), str) or not checkpoint["name"]:
            problems.append(f"checkpoint without a name: {checkpoint!r:.120}")
        elif not isinstance(checkpoint.get("ok"), bool):
            problems.append(f"checkpoint {checkpoint['name']!r} without a boolean 'ok'")
        return problems

    def _legal(self, view: str, frm: str, to: str, data: dict) -> list[str]:
        spec = self.table.views.get(view)
        if spec is None:
            return [f"unknown view {view!r} (published: {sorted(self.table.views)})"]
        problems = [f"{s!r} is not a state of view {view!r}" for s in (frm, to) if s not in spec.states]
        if not problems and not self.table.allowed(view, frm, to):
            problems.append(f"{frm} -> {to} is not in the published {view} table")
        if view == HEALTH and to in self.checkpointed_states and data["checkpoint"].get("ok") is not True:
            problems.append(f"moved into {to} without passing its checkpoint: {data['checkpoint']!r:.200}")
        return problems

    def _timestamps(self, device: str, ts_ns: int) -> list[str]:
        last = self._last_ts.get(device)
        self._last_ts[device] = max(ts_ns, last or 0)
        if last is not None and ts_ns < last:
            return [f"ts_ns {ts_ns} went backwards ({(last - ts_ns) / 1e6:.3f} ms before the "
                    f"device's previous transition)"]
        return []

    def _combination(self, device: str, view: str, frm: str, to: str) -> tuple[list[str], bool]:
        """Problems, and whether this event is the main move a health move announced."""
        if not self._combine:
            return [], False
        problems = []
        expected = self._expect_main.pop(device, None)
        announced = expected is not None and (view, frm, to) == (MAIN, expected[0], expected[1])
        if expected is not None and not announced:
            problems.append(f"expected the main move {expected[0]} -> {expected[1]} that the "
                            f"published combination pairs with {expected[2]} first")
        if view == HEALTH:
            main_now = self._position.get((device, MAIN))
            target = self.table.main_for(frm, to)
            if (target and main_now is not None and target != main_now
                    and self.table.allowed(MAIN, main_now, target)):
                self._expect_main[device] = (main_now, target, f"health {frm} -> {to}")
        return problems, announced

    def _continuity(self, device: str, view: str, frm: str, to: str, announced: bool) -> list[str]:
        problems = []
        spec = self.table.views[view]
        if device in self._ended and not announced:
            # The record ended (REMOVED, and the main move paired with it came): whatever
            # comes next for this BDF is a new record, starting at the initial states.
            self._ended.discard(device)
            for name, other in self.table.views.items():
                self._position[(device, name)] = other.initial
            if frm != spec.initial:
                problems.append(f"after REMOVED the device can only come back as a new record "
                                f"starting at {spec.initial}")
        previous = self._position.get((device, view))
        if previous is None:
            if self.complete_history and frm != spec.initial:
                problems.append(f"first {view} move of the device starts at {frm}, "
                                f"not at the initial state {spec.initial}")
        elif frm != previous and not problems:
            problems.append(f"discontinuous: the device's previous {view} move ended in {previous}")
        self._position[(device, view)] = to
        if view == HEALTH and to in spec.terminal:
            self._ended.add(device)
        return problems

    # -- results --------------------------------------------------------------------------------
    def finish(self) -> list[str]:
        """Violations that only show at the end (a combined main move that never came)."""
        late = [f"{device}: the main move {frm} -> {to} that the published combination pairs with "
                f"{why} never came" for device, (frm, to, why) in sorted(self._expect_main.items())]
        self._expect_main.clear()
        return self._bad(late)

    def summary(self) -> str:
        """How many events were checked, and how often each move was seen."""
        lines = [f"{self.checked} transition event(s) checked, {len(self.violations)} violation(s)"]
        lines += [f"  {view:6} {frm} -> {to}: {n}" for (view, frm, to), n in sorted(self.counts.items())]
        return "\n".join(lines)

    def position(self, device: str, view: str) -> str | None:
        return self._position.get((device, view))

    def assert_clean(self, finished: bool = True) -> None:
        if finished:
            self.finish()
        if self.violations:
            shown = "\n  ".join(self.violations[:25])
            more = f"\n  ... and {len(self.violations) - 25} more" if len(self.violations) > 25 else ""
            raise AssertionError(f"{len(self.violations)} transition violation(s) in "
                                 f"{self.checked} event(s):\n  {shown}{more}")

    def assert_matches_inventory(self, devices: list[dict]) -> None:
        """Every listed device's state/main_state is where its transitions left it.

        A device whose last record ended in REMOVED may only be listed as a new
        record that has not moved yet (initial states).
        """
        problems = []
        for record in devices:
            bdf = record["device"]
            for view, key in ((HEALTH, "state"), (MAIN, "main_state")):
                spec = self.table.views.get(view)
                if spec is None:
                    continue
                if bdf in self._ended:
                    expected, why = spec.initial, "a new record after its transition to REMOVED"
                else:
                    expected = self._position.get((bdf, view))
                    why = "its last transition"
                    if expected is None and self.complete_history:
                        expected, why = spec.initial, "no transition of it was ever emitted"
                if expected is not None and record[key] != expected:
                    problems.append(f"{bdf}: inventory says {view} {record[key]}; {why} says {expected}")
        if problems:
            raise AssertionError("inventory and transition events disagree:\n  " + "\n  ".join(problems))


def _brief(data: dict) -> str:
    return (f"{data.get('device')} {data.get('view')} {data.get('from')}->{data.get('to')}"
            if isinstance(data, dict) else repr(data)[:80])
