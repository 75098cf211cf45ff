"""AER accounting (LIFE-05, AER-01..03): counters, burst filter, policy.

Why a decayed weight: a count threshold cannot tell a short burst of
isolated errors from a sustained rate. Each error adds its severity's weight;
the sum halves every ``half_life_s``. A burst adds at most its size and then
fades; a sustained rate r settles near r * half_life / ln 2 and crosses the
reset threshold. Pure logic: the service feeds it counts and the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("correctable", "nonfatal", "fatal")
_TOTAL_KEYS = {
    "correctable": "TOTAL_ERR_COR",
    "nonfatal": "TOTAL_ERR_NONFATAL",
    "fatal": "TOTAL_ERR_FATAL",
}
_ORDER = {"HEALTHY": 0, "DEGRADED": 1, "FAULTED": 2}
# Errors counted up to this long before BEGIN_RECOVERY belong to that recovery: the
# kernel log line (which triggers a counter read) comes before the recovery uevent.
EPISODE_LOOKBACK_NS = 10_000_000_000


def totals(counters: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per-severity totals of a Sysfs.aer_counters() result (TOTAL_* line, else the sum)."""
    out = {}
    for sev in SEVERITIES:
        table = counters.get(sev) or {}
        key = _TOTAL_KEYS[sev]
        out[sev] = (
            int(table[key])
            if key in table
            else sum(int(v) for k, v in table.items() if not k.startswith("TOTAL"))
        )
    return out


class BurstFilter:
    """An exponentially decayed error weight with a configurable half-life."""

    def __init__(self, half_life_s: float):
        self.half_life_ns = max(1, int(half_life_s * 1e9))
        self._weight = 0.0
        self._at_ns: int | None = None

    def value(self, now_ns: int) -> float:
        if self._at_ns is None:
            return 0.0
        elapsed = max(0, now_ns - self._at_ns)
        return self._weight * 0.5 ** (elapsed / self.half_life_ns)

    def add(self, amount: float, now_ns: int) -> float:
        self._weight = self.value(now_ns) + amount
        self._at_ns = now_ns
        return self._weight

    def clear(self) -> None:
        self._weight, self._at_ns = 0.0, None


@dataclass(frozen=True)
class AerPolicy:
    nonfatal_recovered: str = "HEALTHY"
    fatal_recovered: str = "DEGRADED"
    half_life_s: float = 10.0
    degrade_weight: float = 3.0
    reset_weight: float = 6.0
    fault_weight: float = 10.0
    reset_cooldown_s: float = 5.0
    weights: dict = field(default_factory=lambda: {"correctable": 0.0, "nonfatal": 1.0, "fatal": 2.0})

    @classmethod
    def from_config(cls, table: dict) -> AerPolicy:
        table = dict(table)
        weights = {**cls().weights, **table.pop("error_weight", {})}
        return cls(weights=weights, **table)


@dataclass(frozen=True)
class Verdict:
    health: str  # HEALTHY | DEGRADED | FAULTED: the worst the AER evidence supports
    reset: bool  # the sustained rate asks for a forced reset
    weight: float
    reasons: tuple[str, ...]


class DeviceAer:
    """AER state of one managed device (errors attributed to it, its filter, recovery)."""

    def __init__(self, policy: AerPolicy):
        self.policy = policy
        self.filter = BurstFilter(policy.half_life_s)
        self.counts = {sev: 0 for sev in SEVERITIES}
        self.recovering_since_ns: int | None = None
        self.recovering_severity: str | None = None  # what the kernel's error line named, if it did
        self._unexplained: list[tuple[int, str]] = []  # (ns, severity) not yet tied to a recovery
        self.last_reset_ns: int | None = None

    def record(self, severity: str, count: int, now_ns: int) -> None:
        if count <= 0:
            return
        self.counts[severity] += count
        if severity != "correctable":
            self._unexplained.append((now_ns, severity))
            del self._unexplained[:-64]
        self.filter.add(count * float(self.policy.weights.get(severity, 0.0)), now_ns)

    def begin_recovery(self, now_ns: int, severity: str | None = None) -> None:
        self.recovering_since_ns = now_ns
        self.recovering_severity = severity

    def learn_severity(self, severity: str) -> None:
        """The kernel's line named the open episode's severity (it came after udev opened it)."""
        if self.recovering_since_ns is not None and self.recovering_severity != "fatal":
            self.recovering_severity = severity

    def end_recovery(self, now_ns: int) -> tuple[str, str | None]:
        """Close the episode: (the severity of the uncorrectable errors counted since shortly
        before it began, "fatal" winning; the severity counted now because no counter showed the
        episode's error, else None).

        An episode no counter showed counts once, with the severity the kernel's error line
        named, else as non-fatal. The kernel's line is the only count of a fatal error an endpoint
        reports itself: for a fatal error the kernel does not read the endpoint's AER registers
        (the link is presumed down; "type=Inaccessible"), so its aer_dev_fatal does not grow, nor
        do the port's aer_dev_* (the port was not the source)."""
        since = (self.recovering_since_ns or now_ns) - EPISODE_LOOKBACK_NS
        episode = {sev for ns, sev in self._unexplained if ns >= since}
        named = self.recovering_severity
        uncounted = None
        if named is not None and not episode & {named, "fatal"}:
            uncounted = named  # the line named an error no counter showed (nor a worse one)
        elif not episode:
            uncounted = "nonfatal"
        if uncounted is not None:
            self.record(uncounted, 1, now_ns)
            episode.add(uncounted)
        self._unexplained.clear()
        self.recovering_since_ns = None
        self.recovering_severity = None
        return ("fatal" if "fatal" in episode else "nonfatal"), uncounted

    def verdict(self, now_ns: int, recovered: str | None = None) -> Verdict:
        """Health the AER evidence supports now; ``recovered`` is the severity of a
        recovery that just succeeded (its policy state applies)."""
        p = self.policy
        weight = self.filter.value(now_ns)
        health, reasons = "HEALTHY", []

        def worse(state: str, why: str) -> None:
            nonlocal health
            reasons.append(why)
            if _ORDER[state] > _ORDER[health]:
                health = state

        if recovered == "nonfatal":
            worse(p.nonfatal_recovered, f"non-fatal error recovered: policy {p.nonfatal_recovered}")
        elif recovered == "fatal":
            worse(p.fatal_recovered, f"fatal error recovered: policy {p.fatal_recovered}")
        if weight >= p.fault_weight:
            worse("FAULTED", f"error weight {weight:.2f} >= fault_weight {p.fault_weight:g}")
        elif weight >= p.degrade_weight:
            worse("DEGRADED", f"error weight {weight:.2f} >= degrade_weight {p.degrade_weight:g}")
        cooled = self.last_reset_ns is None or now_ns - self.last_reset_ns >= p.reset_cooldown_s * 1e9
        reset = weight >= p.reset_weight and cooled and health != "FAULTED"
        if reset:
            reasons.append(f"error weight {weight:.2f} >= reset_weight {p.reset_weight:g}: sustained rate")
        return Verdict(health, reset, round(weight, 4), tuple(reasons))

    def note_reset(self, now_ns: int) -> None:
        self.last_reset_ns = now_ns

    def clear(self) -> None:
        """After a successful recover operation: the old errors no longer count."""
        self.filter.clear()

    def to_dict(self, now_ns: int) -> dict:
        return {
            "counts": dict(self.counts),
            "weight": round(self.filter.value(now_ns), 4),
            "recovering": self.recovering_since_ns is not None,
        }


class CounterDeltas:
    """Turns cumulative sysfs counters into per-read increases, per source BDF.

    A counter that went down (device reset, re-probed) restarts from zero.
    The first read of a source only sets its baseline.
    """

    def __init__(self) -> None:
        self._last: dict[str, dict[str, int]] = {}

    def baseline(self, bdf: str, current: dict[str, int]) -> None:
        self._last[bdf] = dict(current)

    def delta(self, bdf: str, current: dict[str, int]) -> dict[str, int]:
        last = self._last.get(bdf)
        self._last[bdf] = dict(current)
        if last is None:
            return {sev: 0 for sev in SEVERITIES}
        return {
            sev: (current.get(sev, 0) - last.get(sev, 0))
            if current.get(sev, 0) >= last.get(sev, 0)
            else current.get(sev, 0)
            for sev in SEVERITIES
        }

    def forget(self, bdf: str) -> None:
        self._last.pop(bdf, None)
