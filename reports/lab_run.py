"""`hilconform lab run`: certify every labgrid place whose tags match, one certify per host,
each under the place's lock, and write the night's record and fleet report.

Why: a nightly lab run must take each host the way a person would (reserve it, lock it, give it
back), never touch a host someone holds, and keep going when one host breaks. Per place, in up to
`max_parallel` threads: a place another user holds is recorded as `held` (the holder named) and
left alone; otherwise a labgrid reservation is made and awaited (`reserve_timeout_s`), the place
is locked (fixtures/labgrid_lock.py, whose guardian gives it back if this process dies), and
`hilconform certify --host labgrid:PLACE --out NIGHT_DIR/PLACE` runs as a process of its own.
While it runs, the place's NetworkService is watched: when its exporter goes away (the lab took
the host off) the certify is stopped and the host recorded `incomplete`. Then the place is
released and the reservation cancelled. NIGHT_DIR/lab-run.json (reports/lab_night.py) records
every host, and fleet.json/fleet.html (reports/fleet.py) are written beside it.

Exit status: the worst of the hosts' (0 conformant or partial, 1 nonconformant, 2 incomplete,
held, not reserved or broken); 2 also when no place matches.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hilconform.fixtures.errors import BadInput
from hilconform.fixtures.labgrid_lab import Lab, LabError, NoNetworkService, NotReserved, PlaceHeld
from hilconform.fixtures.labgrid_lock import PlaceLock

from .lab_night import Night, NightHost, write_night

WATCH_S = 5.0  # between two looks at a certified place's NetworkService
STOP_GRACE_S = 120.0  # a stopped certify's time to end its pytest and write its certificate


class LabRunError(BadInput):
    """Bad input or a lab that cannot be used at all (exit 2)."""


@dataclass
class LabRunOptions:
    tags: dict[str, str]
    coordinator: str
    out: Path  # the night's folder
    max_parallel: int = 1
    reserve_timeout_s: float = 300.0
    suites: list[str] = field(default_factory=list)
    clauses: list[str] = field(default_factory=list)
    pytest_args: list[str] = field(default_factory=list)
    previous: list[Path] = field(default_factory=list)  # earlier nights, for the fleet report


def parse_tags(words: list[str]) -> dict[str, str]:
    tags = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise LabRunError(f"{word!r}: a place tag is KEY=VALUE (e.g. gpu=a100)")
        tags[key] = value
    return tags


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class _Console:
    """One line per event, each prefixed with its place: hosts run side by side."""

    def __init__(self, out):
        self._out, self._lock = out, threading.Lock()

    def say(self, place: str, text: str) -> None:
        with self._lock:
            print(f"[{place}] {text}", file=self._out, flush=True)


class LabRun:
    def __init__(self, options: LabRunOptions, out=sys.stdout):
        self.options = options
        self.console = _Console(out)
        self.stopping = threading.Event()

    # -- the night ---------------------------------------------------------------------------------
    def run(self) -> int:
        options = self.options
        started = _now()
        try:
            with Lab(options.coordinator) as lab:
                places = lab.matching(options.tags)
        except LabError as exc:
            raise LabRunError(str(exc)) from None
        wanted = " ".join(f"{k}={v}" for k, v in options.tags.items())
        if not places:
            raise LabRunError(f"no labgrid place at {options.coordinator} has the tags {wanted}")
        options.out.mkdir(parents=True, exist_ok=True)
        print(f"hilconform lab run: {len(places)} places ({', '.join(places)}) with {wanted}, "
              f"{options.max_parallel} at a time; night folder {options.out}", flush=True)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with ThreadPoolExecutor(max_workers=max(1, options.max_parallel)) as pool:
                hosts = list(pool.map(self.one_host, places))
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        night = Night(coordinator=options.coordinator, tags=dict(options.tags), started=started,
                      ended=_now(), hosts=hosts)
        record = write_night(options.out, night)
        print(f"hilconform lab run: night record {record}", flush=True)
        self._fleet_report()
        for host in hosts:
            print(f"  {host.place}: {host.status}{' ' + host.verdict if host.verdict else ''}"
                  f"{': ' + host.reason if host.reason else ''}", flush=True)
        return max(_exit_code(h) for h in hosts)

    def _on_signal(self, signum, _frame) -> None:
        if not self.stopping.is_set():
            print(f"hilconform lab run: {signal.Signals(signum).name}: stopping every host's certify...",
                  file=sys.stderr, flush=True)
        self.stopping.set()

    def _fleet_report(self) -> None:
        try:
            from .fleet import write_fleet_report
        except ImportError:  # the fleet report is not part of this tool yet
            return
        try:
            paths = write_fleet_report(self.options.out, self.options.previous)
        except Exception as exc:  # noqa: BLE001 (the night's record stands without its report)
            print(f"hilconform lab run: the fleet report could not be written: {exc}", file=sys.stderr)
            return
        print(f"hilconform lab run: fleet report {' '.join(str(p) for p in paths)}", flush=True)

    # -- one host ----------------------------------------------------------------------------------
    def one_host(self, place: str) -> NightHost:
        """`place`'s night; whatever goes wrong with it is recorded as its own, never the others'."""
        started = _now()
        try:
            return self._one_host(place, started)
        except Exception as exc:  # noqa: BLE001 (a bug or an unforeseen lab state: this host's error)
            self.console.say(place, f"error: {type(exc).__name__}: {exc}")
            return NightHost(place=place, status="error", reason=f"{type(exc).__name__}: {exc}"[:500],
                             run_dir=None, verdict=None, exit_code=None, started=started, ended=_now())

    def _one_host(self, place: str, started: str) -> NightHost:

        def record(status: str, reason: str = "", run_dir: str | None = None, verdict: str | None = None,
                   exit_code: int | None = None) -> NightHost:
            if status != "certified" and not reason:
                reason = "no reason given"  # the night's record names one for every such host
            said = f"{status}{' ' + verdict if verdict else ''}{': ' + reason if reason else ''}"
            self.console.say(place, said)
            return NightHost(place=place, status=status, reason=reason, run_dir=run_dir, verdict=verdict,
                             exit_code=exit_code, started=started, ended=_now())

        if self.stopping.is_set():
            return record("error", "the lab run was stopped before this host's turn")
        token = None
        try:
            with Lab(self.options.coordinator) as lab:
                holder = lab.place(place).holder
                if holder is not None and holder != lab.identity:
                    return record("held", f"held by {holder}")
                self.console.say(place, f"reserving (at most {self.options.reserve_timeout_s:g} s)")
                try:
                    token = lab.reserve(place, self.options.tags, self.options.reserve_timeout_s)
                except NotReserved as exc:
                    return record("not_reserved", str(exc))
                try:
                    return self._certify_locked(place, lab, record)
                finally:
                    try:
                        lab.cancel(token)
                    except LabError as exc:
                        self.console.say(place, f"could not cancel reservation {token}: {exc}")
        except PlaceHeld as exc:
            return record("held", f"held by {exc.holder}")
        except LabError as exc:
            return record("error", str(exc) or type(exc).__name__)

    def _certify_locked(self, place: str, lab: Lab, record) -> NightHost:
        lock = PlaceLock(self.options.coordinator, place)
        try:
            lock.take()
        except NoNetworkService as exc:
            return record("error", str(exc))
        self.console.say(place, f"locked; certifying {lock.target.spec}"
                                f"{' (profile ' + lock.profile + ')' if lock.profile else ''}")
        try:
            exit_code, gone = self._certify(place, lab)
        finally:
            lock.release()
            self.console.say(place, "released")
        run_dir = _newest_run(self.options.out / place)
        relative = str(run_dir.relative_to(self.options.out)) if run_dir else None
        certificate = _certificate(run_dir)
        verdict = certificate.get("verdict") if certificate else None
        if gone:
            return record("incomplete", gone, relative, verdict, exit_code)
        if certificate is None:
            return record("incomplete" if relative else "error",
                          f"certify ended with exit status {exit_code} and no certificate", relative, None,
                          exit_code)
        if certificate.get("status") != "complete" or exit_code not in (0, 1):
            reasons = certificate.get("reasons") or [f"certify exit status {exit_code}"]
            return record("incomplete", str(reasons[0]), relative, verdict, exit_code)
        return record("certified", "", relative, verdict, exit_code)

    def _certify(self, place: str, lab: Lab) -> tuple[int, str | None]:
        """Run certify on the locked place; (its exit status, why the lab stopped it or None)."""
        folder = self.options.out / place
        folder.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "hilconform.reports", "certify", "--host", f"labgrid:{place}",
                "--lg-coordinator", self.options.coordinator, "--out", str(folder)]
        for suite in self.options.suites:
            argv += ["--suite", suite]
        for clause in self.options.clauses:
            argv += ["--clause", clause]
        if self.options.pytest_args:
            argv += ["--", *self.options.pytest_args]
        with (folder / "certify.log").open("w") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            relay = threading.Thread(target=self._relay, args=(place, proc, log), daemon=True)
            relay.start()
            gone, stopped_at = None, None
            while proc.poll() is None:
                if gone is None and self.stopping.is_set():
                    gone = "the lab run was stopped (Ctrl-C or SIGTERM)"
                if gone is None:
                    gone = self._lost(place, lab)
                if gone is not None and stopped_at is None:
                    self.console.say(place, f"{gone}: stopping its certify")
                    _signal_group(proc, signal.SIGINT)  # certify stops pytest and writes its certificate
                    stopped_at = time.monotonic()
                elif stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
                    _signal_group(proc, signal.SIGKILL)
                try:
                    proc.wait(timeout=WATCH_S)
                except subprocess.TimeoutExpired:
                    pass
            relay.join(timeout=10)
        if gone is None and proc.returncode not in (0, 1):  # it may have ended on the loss by itself
            gone = self._lost(place, lab)
        return proc.returncode, gone

    @staticmethod
    def _lost(place: str, lab: Lab) -> str | None:
        """Why the lab no longer offers `place`'s host (its exporter or coordinator gone), or None."""
        try:
            lab.network_service(place)
        except NoNetworkService:
            return f"the exporter of {place} went away mid-run (its NetworkService is gone)"
        except LabError as exc:
            return f"the labgrid coordinator went away mid-run: {exc}"
        return None

    def _relay(self, place: str, proc: subprocess.Popen, log) -> None:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            text = line.rstrip()
            if text:
                self.console.say(place, text.removeprefix("hilconform: "))


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def _newest_run(folder: Path) -> Path | None:
    runs = [p for p in folder.iterdir() if (p / "run.json").is_file()] if folder.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def _certificate(run_dir: Path | None) -> dict | None:
    import json

    if run_dir is None or not (run_dir / "certificate.json").is_file():
        return None
    try:
        return json.loads((run_dir / "certificate.json").read_text())
    except (OSError, ValueError):
        return None


def _exit_code(host: NightHost) -> int:
    if host.status == "certified" and host.exit_code in (0, 1):
        return host.exit_code
    return 2


def lab_run(options: LabRunOptions, out=sys.stdout) -> int:
    return LabRun(options, out).run()
