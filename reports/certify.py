"""`hilconform certify`: run the suites as a pytest process, show progress per clause, write the run folder.

Steps: check the input (host, suites, clauses) with a collect-only pytest run
before anything starts; run pytest with the run folder's options; print one
line per finished test while it runs; then build certificate.json, the Allure
environment and categories, and report.html from the folder's files. Ctrl-C is
forwarded once to pytest's process group (pytest ends the VMs); the folder is
still completed and says the run is incomplete.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hilconform.fixtures.errors import BadInput, ProfileError
from hilconform.fixtures.host_spec import HostSpecError, parse_host_spec, serves_device_models
from hilconform.fixtures.inconclusive_outcome import OPTION as INCONCLUSIVE_OPTION
from hilconform.fixtures.labgrid_lab import LabError, coordinator_address
from hilconform.fixtures.labgrid_lock import PlaceLock

from . import allure_files, certificate, html_report
from .run_folder import RunFolder
from .verdicts import UNFINISHED_OUTCOMES, clause_verdict

# A source checkout's root, or an installed site-packages/hilconform: both hold suites/ (pyproject.toml)
CHECKOUT = Path(__file__).resolve().parent.parent
SUITES = CHECKOUT / "suites"
# The pytest settings a certification runs with, checkout or installed alike (not the checkout's
# pyproject.toml, which an installed hilconform does not have).
PYTEST_INI = Path(__file__).resolve().with_name("certify-pytest.ini")
EMULATED_TWINS = "real/test_*_model_*.py"  # real-host clauses checked on emulated device models too
SELF_CHECK_COMMAND = (sys.executable, "-m", "hilconform.reports.self_check")
MUTANT_CATALOGUE = CHECKOUT / "tests" / "mutants" / "mutants.toml"  # test data of a source checkout
POLL_S = 0.5
INTERRUPT_GRACE_S = (
    120.0  # after Ctrl-C, how long pytest may take to end its VMs before SIGTERM, then SIGKILL
)
COLLECT_TIMEOUT_S = 180.0
# Workers on an emulated host: 3 on 2 cores. At 2 the cores idled ~40% of a certify (tests waiting
# on the guest: lease TTLs, drains, hot-plug); a third worker fills that (2 cores: 6:03 -> 4:47
# for both hosts, docs/performance.md). `worksteal`: a worker that runs out takes half of another's
# queue, so no worker idles behind another's long tests at the end.
EMULATED_WORKERS = 3
XDIST_DISTRIBUTION = ("--dist", "worksteal")
PYTEST_CONFIG = ("-c", str(PYTEST_INI), "--rootdir", str(CHECKOUT), "--confcutdir", str(CHECKOUT))


class CertifyError(BadInput):
    """Bad input or a run that could not start: the message says what was wrong (exit 2)."""


@dataclass
class CertifyOptions:
    host: str
    suites: list[str] = field(default_factory=list)
    clauses: list[str] = field(default_factory=list)
    out: Path = field(default_factory=lambda: Path.cwd() / "reports")
    workers: int | None = None  # None: EMULATED_WORKERS on an emulated host, 1 on a real one (one runtime)
    runtime_module: str | None = None
    self_check: bool = False
    max_minutes: float = 180.0
    pytest_args: list[str] = field(default_factory=list)
    lg_coordinator: str | None = None  # --host labgrid:PLACE: the coordinator (else $LG_COORDINATOR)


def available_suites() -> list[str]:
    if not SUITES.is_dir():
        raise CertifyError(f"{SUITES}: no suites folder: this hilconform is installed without its suites "
                           "(reinstall it from a wheel or sdist, or run from a source checkout)")
    return sorted(p.name for p in SUITES.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def _die_with_parent() -> None:
    """In the pytest child: if the CLI is killed outright, pytest gets SIGTERM (and ends its VMs)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _suite_paths(options: CertifyOptions) -> list[str]:
    known = available_suites()
    unknown = [s for s in options.suites if s not in known]
    if unknown:
        raise CertifyError(f"unknown suite {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
    # Default: every area but smoke (test-bed checks, no clause); `real` only for real hosts, except its
    # emulated twins (REAL-01 on device models) on hosts that serve models: on stock-device hosts they
    # would only skip, making every such run "partial".
    real = _is_real(options.host)
    skipped = {"smoke"} | (set() if real else {"real"})
    chosen = options.suites or [s for s in known if s not in skipped]
    twins = [] if real or options.suites or not _serves_models(options.host) else SUITES.glob(EMULATED_TWINS)
    return [f"suites/{s}" for s in chosen] + sorted(str(t.relative_to(CHECKOUT)) for t in twins)


def _is_real(host: str) -> bool:
    """Whether --host names a real host, by the plugin's own spec parser (a malformed spec: False;
    the collect step reports it as bad input)."""
    try:
        return parse_host_spec(host).is_real
    except HostSpecError:
        return False


def _serves_models(host: str) -> bool:
    """Whether an emulated host's profile puts device models in its slots (an unknown name: False,
    and the collect step reports it). Reads the profile's TOML only."""
    try:
        return serves_device_models(parse_host_spec(host))
    except (HostSpecError, ProfileError):
        return False


def collect_scope(options: CertifyOptions, paths: list[str]) -> dict:
    """Which tests and clauses the run covers; pytest's own usage errors (e.g. --host) become CertifyError."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        "--collect-only",
        "-q",
        "--list-clauses",
        "--check-host",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",
        "--host",
        options.host,
        *PYTEST_CONFIG,
    ]
    if options.runtime_module:
        argv += ["--runtime-module", options.runtime_module]
    argv += options.pytest_args
    try:
        done = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=COLLECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CertifyError(f"collecting the suites took over {COLLECT_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise CertifyError(_collect_failure(done.stderr + done.stdout))
    clauses: dict[str, list[str]] = {}
    tests = []
    for line in done.stdout.splitlines():
        if line.startswith("clause "):
            _, clause, nodeid = line.split(" ", 2)
            clauses.setdefault(clause, []).append(nodeid)
        elif "::" in line and not line.startswith(" "):
            tests.append(line.strip())
    if options.clauses:
        unknown = [c for c in options.clauses if c not in clauses]
        if unknown:
            raise CertifyError(
                f"no test of the chosen suites checks clause {', '.join(unknown)} "
                f"(clauses here: {', '.join(sorted(clauses))})"
            )
        clauses = {c: clauses[c] for c in options.clauses}
        tests = [t for c in options.clauses for t in clauses[c]]
    return {"clauses": clauses, "tests": tests}


def _collect_failure(output: str) -> str:
    """The reason the collect pass gave: the host's up-front check (`pytest.exit`, one line), a usage
    error, or else the last lines pytest printed."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in lines:  # pytest.exit's banner: "!!!! _pytest.outcomes.Exit: hilconform: ... !!!!"
        if "Exit: hilconform: " in line:
            return line.split("Exit: hilconform: ", 1)[1].rstrip("! ")
    usage = [ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR: ")]
    if usage:  # pytest.UsageError: bad input (host, profile, options), said as it is
        return "\n  ".join(usage[:8])
    errors = [ln for ln in lines if "error" in ln.lower()] or lines[-5:]
    return "the suites could not be collected: " + "\n  ".join(errors[:8])


def check_workers(options: CertifyOptions) -> int:
    """The worker count, checked before anything starts: a real host runs one runtime, so one worker."""
    real = _is_real(options.host)
    workers = options.workers if options.workers is not None else (1 if real else EMULATED_WORKERS)
    if workers < 0:
        raise CertifyError(f"--workers {workers}: must be 0 or more")
    if real and workers > 1:
        raise CertifyError(
            f"--host {options.host}: a real host runs one runtime, so it is certified with one worker "
            f"(-n 1, the default there, or -n 0), not -n {workers}"
        )
    return workers


class Progress:
    """Prints one line per finished test from progress.jsonl as pytest writes it, and a clause's verdict
    once its last test has finished."""

    def __init__(self, run: RunFolder, total: int, out, clauses: dict[str, list[str]] | None = None):
        self.run, self.total, self.out = run, total, out
        self.pending = {clause: set(nodeids) for clause, nodeids in (clauses or {}).items()}
        self.outcomes: dict[str, list[str]] = {}
        self.offset = 0
        self.done = 0
        self.buffer = ""

    def poll(self) -> None:
        try:
            with self.run.progress.open() as stream:
                stream.seek(self.offset)
                chunk = stream.read()
                self.offset = stream.tell()
        except FileNotFoundError:
            return
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            record = json.loads(line) if line.strip() else {}
            if record.get("kind") == "test":
                self.done += 1
                clause = record.get("clause") or "-"
                print(
                    f"[{self.done:>3}/{self.total}] {clause:<8} {record['outcome']:<8} "
                    f"({record['duration_s']:6.1f} s)  {record['nodeid']}",
                    file=self.out,
                    flush=True,
                )
                if record["outcome"] in ("failed", "broken", "error", *UNFINISHED_OUTCOMES) and record.get(
                    "message"
                ):
                    first = record["message"].strip().splitlines()[0][:200]
                    print(f"{'':>10}{record['outcome']}: {first}", file=self.out, flush=True)
                self._clause_done(record)

    def _clause_done(self, record: dict) -> None:
        nodeid = record["nodeid"]
        clause = record.get("clause") or next((c for c, ids in self.pending.items() if nodeid in ids), None)
        if clause not in self.pending:
            return
        self.outcomes.setdefault(clause, []).append(record["outcome"])
        self.pending[clause].discard(nodeid)
        if not self.pending[clause]:
            del self.pending[clause]
            verdict = clause_verdict(self.outcomes[clause])
            print(f"{'':>10}=> {clause}: {verdict}", file=self.out, flush=True)

    def finish(self) -> None:
        """After pytest ended: the clauses some of whose tests never reported, with those tests."""
        for clause, missing in sorted(self.pending.items()):
            verdict = clause_verdict(self.outcomes.get(clause, []) + ["unfinished"] * len(missing))
            print(
                f"{'':>10}=> {clause}: {verdict} (no result from: {', '.join(sorted(missing))})",
                file=self.out,
                flush=True,
            )
        self.pending.clear()


def _pytest_argv(options: CertifyOptions, run: RunFolder, targets: list[str]) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-n",
        str(options.workers),
        *(XDIST_DISTRIBUTION if options.workers > 1 else ()),
        "--host",
        options.host,
        "--junitxml",
        str(run.junit),
        "--alluredir",
        str(run.allure_results),
        "--measurements-dir",
        str(run.measurements_dir),
        "--run-dir",
        str(run.path),
        "-p",
        "no:cacheprovider",
        "-rfEs",
        # An inconclusive is judged from the run record (clause inconclusive: incomplete, exit 2);
        # without this pytest would exit 2 for it too, which PYTEST_TROUBLE reads as interrupted.
        INCONCLUSIVE_OPTION,
        *PYTEST_CONFIG,
    ]
    if options.runtime_module:
        argv += ["--runtime-module", options.runtime_module]
    return argv + options.pytest_args


def _run_pytest(
    argv: list[str], run: RunFolder, progress: Progress, deadline_s: float
) -> tuple[int, str | None]:
    """Run pytest, printing progress; returns (exit status, why it was interrupted or None)."""
    interrupted: list[str] = []

    def on_signal(signum, _frame):
        interrupted.append(f"{signal.Signals(signum).name} received")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    with run.pytest_log.open("w") as log:
        proc = subprocess.Popen(
            argv,
            cwd=CHECKOUT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        started = time.monotonic()
        forwarded_at = None
        while proc.poll() is None:
            progress.poll()
            now = time.monotonic()
            if not interrupted and now - started > deadline_s:
                interrupted.append(f"ran past the run deadline ({deadline_s / 60:.0f} min)")
            if interrupted and forwarded_at is None:
                print(
                    f"hilconform: {interrupted[0]}: stopping pytest (it ends the VMs)...",
                    file=sys.stderr,
                    flush=True,
                )
                _signal_group(proc, signal.SIGINT)
                forwarded_at = now
            elif forwarded_at is not None and now - forwarded_at > INTERRUPT_GRACE_S:
                _signal_group(
                    proc, signal.SIGKILL if now - forwarded_at > INTERRUPT_GRACE_S + 30 else signal.SIGTERM
                )
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
        progress.poll()
        progress.finish()
    finally:
        if proc.poll() is None:  # the CLI itself is failing: never leave pytest behind
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return proc.returncode, (interrupted[0] if interrupted else None)


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def _self_check(run: RunFolder, host: str, deadline_s: float) -> dict:
    """The self-check's contract: `--full --out DIR` writes the suites' mutant sensitivity table."""
    argv = [
        *SELF_CHECK_COMMAND,
        "--full",
        "--out",
        str(run.sensitivity_dir),
        "--host",
        host,
    ]
    try:
        done = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=deadline_s)
        status, output = done.returncode, (done.stdout + done.stderr)[-4000:]
    except subprocess.TimeoutExpired:
        status, output = None, f"ran past {deadline_s:.0f} s"
    tables = {}
    for path in sorted(run.sensitivity_dir.glob("*.json")) if run.sensitivity_dir.is_dir() else []:
        try:
            tables[path.name] = json.loads(path.read_text())
        except json.JSONDecodeError:
            tables[path.name] = "(unreadable JSON)"
    files = sorted(p.name for p in run.sensitivity_dir.iterdir()) if run.sensitivity_dir.is_dir() else []
    summary = {
        0: "every mutant killed, reference passed",
        1: "a mutant survived or the reference failed",
        2: "broken: the sensitivity run could not judge",
    }.get(status, "did not finish")
    return {
        "command": argv[1:],  # without the interpreter's path
        "exit_code": status,
        "summary": summary,
        "files": files,
        "tables": tables,
        "output_tail": output,
    }


def finish(run: RunFolder, sensitivity: dict | None = None) -> dict:
    """certificate.json, Allure environment/categories and report.html from the run folder's files."""
    cert = certificate.build(run, sensitivity)
    certificate.write(run, cert)
    allure_files.write_categories(run.allure_results)
    allure_files.write_environment(run.allure_results, cert)
    html_report.write(run, cert)
    return cert


def certify(options: CertifyOptions, out=sys.stdout) -> int:
    """Certify `options.host`; a labgrid place is held from before the host check to the verdict
    (fixtures/labgrid_lock.py: the pytest runs inside find it held by this identity and use it)."""
    if options.lg_coordinator:
        os.environ["LG_COORDINATOR"] = options.lg_coordinator  # for this run and the pytest runs it starts
    place = _labgrid_place(options.host)
    if place is None:
        return _certify(options, out)
    lock = PlaceLock(coordinator_address(options.lg_coordinator), place)
    try:
        lock.take()
    except LabError as exc:
        raise CertifyError(f"--host {options.host}: {exc}") from None
    print(f"hilconform: holding labgrid place {place} ({lock.target.spec}"
          f"{', profile ' + lock.profile if lock.profile else ''}) for this run", file=out, flush=True)
    try:
        return _certify(options, out)
    finally:
        if lock.took:
            lock.release()
            print(f"hilconform: labgrid place {place} given back", file=out, flush=True)


def _labgrid_place(host: str) -> str | None:
    try:
        return parse_host_spec(host).place
    except HostSpecError:
        return None  # the collect step reports it as bad input


def _certify(options: CertifyOptions, out) -> int:
    paths = _suite_paths(options)
    if options.self_check and not MUTANT_CATALOGUE.is_file():
        raise CertifyError(
            f"--self-check needs the mutant catalogue {MUTANT_CATALOGUE} (a source checkout with "
            "tests/mutants); it is not there"
        )
    options.workers = check_workers(options)
    print(f"hilconform: certifying {options.host}: collecting {', '.join(paths)}", file=out, flush=True)
    scope = collect_scope(options, paths)
    targets = scope["tests"] if options.clauses else paths
    try:
        run = RunFolder.create(options.out.resolve(), options.host)  # pytest runs in CHECKOUT
    except OSError as exc:
        raise CertifyError(f"--out {options.out}: cannot make the run folder there ({exc})") from None
    argv = _pytest_argv(options, run, targets)
    started = time.time()
    meta = {
        "run_id": run.path.name,
        "status": "running",
        "started": _iso(started),
        "finished": None,
        "duration_s": None,
        "host": options.host,
        "suites": paths,
        "clauses_selected": options.clauses,
        "workers": options.workers,
        "runtime_module": options.runtime_module,
        "pytest_argv": argv[1:],
        "pytest_args": options.pytest_args,
        "pytest_exit": None,
        "interrupted": None,
        "scope": scope,
        "tool_versions": certificate.tool_versions(),
    }
    run.write_run(meta)
    print(
        f"hilconform: run folder {run.path}; {len(scope['tests'])} tests, {len(scope['clauses'])} clauses, "
        f"{options.workers} workers (pytest output: {run.pytest_log})",
        file=out,
        flush=True,
    )
    status, interrupted = _run_pytest(
        argv, run, Progress(run, len(scope["tests"]), out, scope["clauses"]), options.max_minutes * 60
    )
    meta.update(
        status="interrupted" if interrupted else "finished",
        finished=_iso(time.time()),
        duration_s=round(time.time() - started, 1),
        pytest_exit=status,
        interrupted=interrupted,
    )
    run.write_run(meta)
    sensitivity = None
    if options.self_check and not interrupted:
        print("hilconform: self-check: running the suite sensitivity tests...", file=out, flush=True)
        sensitivity = _self_check(run, options.host, options.max_minutes * 60)
    cert = finish(run, sensitivity)
    _print_verdict(cert, run, out)
    return cert["exit_code"]


def _print_verdict(cert: dict, run: RunFolder, out) -> None:
    for reason in cert["reasons"]:
        print(f"hilconform:   {reason}", file=out)
    command = allure_files.render_command(run.allure_results)
    if command:
        print(
            f"hilconform: Allure is installed: `hilconform report allure {run.path}` renders the Allure "
            "report",
            file=out,
        )
    print(
        f"hilconform: verdict {cert['verdict'].upper()} (exit {cert['exit_code']}); run folder {run.path}",
        file=out,
        flush=True,
    )


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
