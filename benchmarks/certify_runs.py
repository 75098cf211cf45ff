"""What the certify benchmarks share (loaded_gate.py, flip_rate.py, certify_wall_time.py): the CPU
hogs that load the machine, `hilconform certify` runs as children the benchmark owns, and reading
what such a run left behind (its run folder and certificate.json, docs/certificate.md).

A benchmark starts and ends only its own processes: every child is started here, in a session of
its own (a Ctrl-C at the terminal reaches the benchmark alone, which then ends its children in
order), and set to die with the benchmark should the benchmark itself be killed outright
(PR_SET_PDEATHSIG): a hog with SIGKILL, a certify run with SIGTERM, which certify takes as an
interruption (it stops its pytest, which ends its VMs, and writes an incomplete certificate).
Nothing is signalled by name or by group: only the Popen objects held here.

A run counts as incomplete, never as a pass, when it crashed, was stopped (deadline, Ctrl-C), left
no readable certificate, or exited with another status than its certificate states.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOG = "while True: pass"
LOAD_WAIT_S = 240.0
LOAD_SAMPLE_S = 10.0  # how often a run's load average is sampled
CERTIFY = [sys.executable, "-m", "hilconform.reports", "certify"]
MAKE_CERTIFY_HOSTS = ["emulated:a100", "emulated:a100-stock"]  # the Makefile's HOST, STOCK_HOST
MAX_MINUTES = 30.0  # certify's own deadline per run (--max-minutes); a whole run takes 2-10 min
OVERRUN_S = 300.0  # past that deadline, how long before the benchmark stops certify itself
# After Ctrl-C (SIGINT) certify gives its pytest 120 s to end the VMs, then SIGTERM, SIGKILL at 150 s.
STOP_GRACE_S = 180.0
POLL_S = 1.0
_PR_SET_PDEATHSIG = 1


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def hog_count(target_load: float) -> int:
    """Hogs for a target load: none when idle (<= 0); else one more than the target, since with
    --load of them the 1-minute average only creeps towards it."""
    return math.ceil(target_load) + 1 if target_load > 0 else 0


def _die_with_us(signum: int):
    """A preexec_fn: the child gets `signum` when the benchmark dies, however it dies; and SIGINT
    back at its default, so that the benchmark's stop (SIGINT first) reaches it even when the
    benchmark itself was started in the background (`cmd &` starts it with SIGINT ignored, and an
    ignored signal stays ignored across exec: the stop then waited out the whole kill grace)."""

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    return preexec


def start_hogs(count: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", HOG],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_us(signal.SIGKILL),
        )
        for _ in range(count)
    ]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:  # our own children: the Popen objects prove it
        hog.kill()
    for hog in hogs:
        hog.wait(timeout=10)


class LoadSampler:
    """The 1-minute load average every `every_s` seconds while a run lasts: its start and end alone
    say little of a 10-minute run (the hogs' share settles, certify's VMs come and go)."""

    def __init__(self, every_s: float = LOAD_SAMPLE_S):
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="load-sampler", daemon=True)

    def _sample(self) -> None:
        while True:
            self.samples.append(load())
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def wait_for_load(target: float) -> float:
    deadline = time.monotonic() + LOAD_WAIT_S
    while load() < target and time.monotonic() < deadline:
        time.sleep(5)
    return load()


def interrupt_on_sigterm() -> None:
    """SIGTERM and SIGHUP end the benchmark as Ctrl-C does: its children are ended, its results kept."""

    def handler(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handler)


def run_owned(argv: Sequence[str], log: Path, deadline_s: float | None) -> tuple[int, str | None, bool]:
    """Run `argv` as the benchmark's own child, its output to `log`, until it ends.

    Past `deadline_s`, or on Ctrl-C (KeyboardInterrupt), it is asked to stop (SIGINT: certify then
    ends its pytest and VMs), and killed STOP_GRACE_S later (at once on a second Ctrl-C).
    Returns (exit status, why the benchmark stopped it or None, whether the user interrupted)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_us(signal.SIGTERM),
        )
    started = time.monotonic()
    why: str | None = None
    interrupted = False
    asked_at: float | None = None
    try:
        while proc.poll() is None:
            try:
                now = time.monotonic()
                if why is None and deadline_s is not None and now - started > deadline_s:
                    why = f"ran past the benchmark's deadline ({deadline_s / 60:.1f} min)"
                if why is not None and asked_at is None:
                    proc.send_signal(signal.SIGINT)
                    asked_at = now
                elif asked_at is not None and now - asked_at > STOP_GRACE_S:
                    proc.kill()
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:
                if interrupted:
                    proc.kill()
                    continue
                interrupted = True
                why = why or "interrupted (Ctrl-C or SIGTERM)"
                print(
                    f"\nbenchmark: stopping {Path(argv[0]).name} pid {proc.pid} (it ends its own children; "
                    f"killed in {STOP_GRACE_S:.0f} s, or at once on another Ctrl-C)...",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if proc.poll() is None:  # the benchmark itself is failing: never leave the child behind
            proc.kill()
            proc.wait()
    return proc.returncode, why, interrupted


def read_certificate(out: Path) -> tuple[Path | None, dict | None, str | None]:
    """The run folder certify made under `out` (the --out it was given, one run) and its certificate:
    (folder or None, certificate or None, why there is no certificate or None)."""
    folders = sorted(marker.parent for marker in out.glob("*/run.json"))
    if not folders:
        return None, None, "no run folder"
    folder = folders[-1]
    path = folder / "certificate.json"
    if not path.is_file():
        return folder, None, "no certificate.json"
    try:
        certificate = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return folder, None, f"certificate.json unreadable ({exc})"
    from hilconform.reports.certificate import CertificateInvalid, validate

    try:
        validate(certificate)
    except CertificateInvalid as exc:
        return folder, None, str(exc)
    return folder, certificate, None


@dataclass
class CertifyRun:
    """One `hilconform certify` run and what it left."""

    host: str
    index: int  # 1-based, in the order the runs were made
    out: Path  # the --out folder it was given; its run folder is made in it
    started: str  # UTC, ISO 8601
    seconds: float
    load_start: float  # 1-minute load average
    load_end: float
    exit_code: int | None
    stopped: str | None = None  # why the benchmark stopped it (deadline, Ctrl-C); None: it ended itself
    interrupted: bool = False  # the user interrupted the benchmark during this run
    folder: Path | None = None  # the run folder, reports/<run-id> under `out`
    certificate: dict | None = None
    no_certificate: str | None = None  # why there is none
    load_samples: list[float] = field(default_factory=list)  # every LOAD_SAMPLE_S during the run

    @classmethod
    def read(cls, host: str, index: int, out: Path, **measured) -> CertifyRun:
        folder, certificate, why = read_certificate(out)
        return cls(host, index, out, folder=folder, certificate=certificate, no_certificate=why, **measured)

    @property
    def problem(self) -> str | None:
        """Why the run is incomplete whatever its certificate says; None when the certificate stands."""
        if self.stopped:
            return f"stopped by the benchmark: {self.stopped} (exit {self.exit_code})"
        if self.certificate is None:
            return f"{self.no_certificate} (certify exit {self.exit_code})"
        if self.certificate["host"].get("spec") != self.host:
            return f"its certificate is for {self.certificate['host'].get('spec')}, not {self.host}"
        if self.exit_code != self.certificate["exit_code"]:
            return f"certify exited {self.exit_code}; its certificate says {self.certificate['exit_code']}"
        return None

    @property
    def verdict(self) -> str:
        """The certificate's verdict, or `incomplete` when the run has a problem."""
        return "incomplete" if self.problem or self.certificate is None else self.certificate["verdict"]

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is not plainly conformant: the run's problem, then the certificate's reasons."""
        return [p for p in [self.problem] if p] + list((self.certificate or {}).get("reasons", []))

    def clause_verdicts(self) -> dict[str, str]:
        """Clause ID -> verdict, in spec order; empty without a certificate."""
        return {c["id"]: c["verdict"] for c in (self.certificate or {}).get("clauses", [])}

    @property
    def load_median(self) -> float:
        """The run's median 1-minute load average (its start and end when nothing was sampled)."""
        return statistics.median(self.load_samples or [self.load_start, self.load_end])

    def line(self, runs: int | None = None) -> str:
        of = f"/{runs}" if runs else ""
        return (
            f"run {self.index}{of} {self.host:<20} {self.seconds / 60:5.2f} min  exit {self.exit_code}  "
            f"{self.verdict:<13} load {self.load_start:.2f} -> {self.load_end:.2f} "
            f"(median {self.load_median:.2f})  "
            f"{self.folder or self.out}"
        )

    def summary(self) -> dict:
        """What the benchmark's JSON keeps of the run (not the certificate: it stays in the run folder)."""
        return {
            "host": self.host,
            "index": self.index,
            "started": self.started,
            "seconds": round(self.seconds, 1),
            "load_start": round(self.load_start, 2),
            "load_end": round(self.load_end, 2),
            "load_median": round(self.load_median, 2),
            "load_min": round(min(self.load_samples, default=self.load_start), 2),
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "stopped": self.stopped,
            "folder": str(self.folder) if self.folder else None,
            "out": str(self.out),
            "clauses": self.clause_verdicts(),
        }


def certify(
    host: str,
    out: Path,
    index: int = 1,
    suites: Sequence[str] = (),
    extra: Sequence[str] = (),
    max_minutes: float = MAX_MINUTES,
) -> CertifyRun:
    """One `hilconform certify --host H --out OUT` run (certify's output in OUT/certify.log); `extra`
    goes last (it may hold `-- PYTEST_ARGS`). A Ctrl-C during it ends it in order and is recorded
    (`interrupted`): the caller decides whether to go on."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [*CERTIFY, "--host", host, "--out", str(out), "--max-minutes", f"{max_minutes:g}"]
    for suite in suites:
        argv += ["--suite", suite]
    argv += list(extra)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start, began = load(), time.monotonic()
    with LoadSampler() as sampler:
        code, stopped, interrupted = run_owned(argv, out / "certify.log", max_minutes * 60 + OVERRUN_S)
    return CertifyRun.read(
        host,
        index,
        out,
        started=started,
        seconds=time.monotonic() - began,
        load_start=load_start,
        load_end=load(),
        load_samples=sampler.samples,
        exit_code=code,
        stopped=stopped,
        interrupted=interrupted,
    )
