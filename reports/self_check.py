"""The self-check: run the suites against mutant runtimes and write the sensitivity table.

A module of the reports package (`python -m hilconform.reports.self_check`), run by
`hilconform certify --self-check` and `make self-check`. The mutants are test data of a
source checkout: their catalogue (`--catalogue`, default tests/mutants/mutants.toml) names
each mutant's module, which the host runs as its runtime (`--runtime-module`).

For each mutant of the catalogue: `pytest <its tests> --runtime-module
<its module>` in a subprocess (JUnit XML, log), then a verdict:

* killed    a selected test marked with the clause the mutant breaks FAILED
            (a conformance failure, not an error or a skip), or failed naming that clause
            as also broken (property also_failed_clause: LIFE-01, checked on every test's
            events), and the guest ran the mutant;
* survived  every selected test passed or skipped;
* broken    the run could not judge: errors (infrastructure), a timeout, no JUnit,
            or no evidence that the guest ran the mutant.

Then the converse: the union of the selections once against the reference runtime,
every test must pass (a skip is not a pass). Writes OUT/sensitivity.json and
OUT/sensitivity.md (mutant -> clause broken -> tests that caught it, verdict), and
OUT/junit/, OUT/logs/.

Usage (python -m hilconform.reports.self_check ...):
  --full --out DIR           every mutant + the reference
  --out DIR                  the CI subset (ci = true) + the reference
  --mutant NAME ... --out DIR
  options: --catalogue FILE, --no-reference, --reference-only, --jobs N (parallel pytest runs, default 2),
           --host KIND:NAME (default emulated:a100-stock), --timeout-s S (per pytest run),
           --doc docs/sensitivity.md (put the table between its TABLE_BEGIN/TABLE_END markers)
Exit status: 0 every mutant killed and the reference passed; 1 a mutant survived or
the reference failed; 2 infrastructure (a run broken, bad arguments), when nothing survived.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hilconform.fixtures.clauses import ALSO_FAILED_PROPERTY, LATE_FINDING, OWN_CLAUSE_PASSED_PROPERTY
from hilconform.fixtures.errors import BadInput

CHECKOUT = Path(__file__).resolve().parent.parent
CATALOGUE = CHECKOUT / "tests" / "mutants" / "mutants.toml"
PROBE_PLUGIN = "hilconform.fixtures.runtime_identity"  # a pytest plugin: which runtime answered
IDENTITY_PROPERTY = "runtime_identity"
REFERENCE = "reference"
DEFAULT_TIMEOUT_S = 1200
EXIT_OK, EXIT_SURVIVED, EXIT_BROKEN = 0, 1, 2
TABLE_BEGIN, TABLE_END = "<!-- sensitivity-table:begin -->", "<!-- sensitivity-table:end -->"


class CatalogueError(BadInput):
    """mutants.toml is malformed (the message names the entry and the key)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    breaks: str
    how: str
    tests: tuple[str, ...]
    ci: bool
    hosts: tuple[str, ...] = ()  # the hosts that can show it (empty: any host)
    under_load: bool = False  # misbehaves only when CPU load slows it: shown by benchmarks/loaded_gate.py


@dataclass
class TestOutcome:
    nodeid: str
    outcome: str  # passed | failed | error | skipped | missing
    clause: str | None = None
    message: str = ""
    identities: list[str] = field(default_factory=list)
    seconds: float = 0.0
    also_failed: list[str] = field(default_factory=list)  # other clauses its call found broken
    own_clause_passed: bool = False  # failed for those alone


@dataclass
class RunResult:
    name: str  # a mutant's name, or "reference"
    runtime: str  # the module the guest ran
    breaks: str | None
    how: str
    verdict: str  # killed | survived | broken | passed | failed
    why: str
    caught_by: list[str]
    wall_s: float
    # pytest's exit status, for the record only: the verdict comes from the JUnit XML (an inconclusive
    # test is a JUnit skip: a mutant's survival, the reference's failure), and pytest exits 2 for an
    # inconclusive as for an interrupted run (fixtures/inconclusive_outcome.py).
    exit_code: int | None
    tests: list[TestOutcome]


def load_catalogue(path: Path = CATALOGUE) -> list[Mutant]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    mutants, seen = [], set()
    for index, entry in enumerate(data.get("mutant", [])):
        where = f"{path.name}: mutant #{index + 1} ({entry.get('name', '?')})"
        for key, kind in (("name", str), ("module", str), ("breaks", str), ("how", str),
                          ("tests", list), ("ci", bool)):
            if not isinstance(entry.get(key), kind):
                raise CatalogueError(f"{where}: key {key!r} missing or not a {kind.__name__}")
        if entry["name"] in seen:
            raise CatalogueError(f"{where}: duplicate name")
        if not entry["tests"] or not all(isinstance(t, str) and "::" in t for t in entry["tests"]):
            raise CatalogueError(f"{where}: 'tests' must list pytest node ids (path::test)")
        unknown = sorted(set(entry) - {"name", "module", "breaks", "how", "tests", "ci", "hosts",
                                       "under_load"})
        if unknown:
            raise CatalogueError(f"{where}: unknown key {unknown[0]!r}")
        hosts = entry.get("hosts", [])
        if not isinstance(hosts, list) or not all(isinstance(h, str) and ":" in h for h in hosts):
            raise CatalogueError(f"{where}: 'hosts' must list hosts as KIND:NAME")
        under_load = entry.get("under_load", False)
        if not isinstance(under_load, bool):
            raise CatalogueError(f"{where}: 'under_load' must be true or false")
        if under_load and entry["ci"]:
            raise CatalogueError(f"{where}: an 'under_load' mutant cannot be in the CI subset "
                                 f"(it needs CPU hogs)")
        seen.add(entry["name"])
        mutants.append(Mutant(entry["name"], entry["module"], entry["breaks"], entry["how"],
                              tuple(entry["tests"]), entry["ci"], tuple(hosts), under_load))
    if not mutants:
        raise CatalogueError(f"{path}: no [[mutant]] entries")
    return mutants


# -- reading a run's JUnit XML -------------------------------------------------------------------

def nodeid_of(case: ET.Element) -> str:
    """pytest's node id from a JUnit testcase (classname suites.hotplug.test_x, name test_y[p])."""
    parts = (case.get("classname") or "").split(".")
    return "/".join(parts) + ".py::" + (case.get("name") or "")


def read_junit(path: Path) -> dict[str, TestOutcome]:
    outcomes: dict[str, TestOutcome] = {}
    for case in ET.parse(path).iter("testcase"):
        nodeid = nodeid_of(case)
        props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        tags = {child.tag: child for child in case}
        if "failure" in tags:
            outcome, detail = "failed", tags["failure"]
        elif "error" in tags and LATE_FINDING in (tags["error"].get("message") or ""):
            outcome, detail = "failed", tags["error"]  # a finding of the run, read at the last teardown
        elif "error" in tags:
            outcome, detail = "error", tags["error"]
        elif "skipped" in tags:
            outcome, detail = "skipped", tags["skipped"]
        else:
            outcome, detail = "passed", None
        message = (detail.get("message") or "") if detail is not None else ""
        outcomes[nodeid] = TestOutcome(
            nodeid, outcome,
            clause=next((v for k, v in props if k == "clause"), None),
            message=" ".join(message.split())[:400],
            identities=sorted({v for k, v in props if k == IDENTITY_PROPERTY}),
            seconds=round(float(case.get("time") or 0.0), 1),
            also_failed=sorted({v for k, v in props if k == ALSO_FAILED_PROPERTY}),
            own_clause_passed=any(k == OWN_CLAUSE_PASSED_PROPERTY for k, _ in props),
        )
    return outcomes


def judge_mutant(mutant: Mutant, outcomes: dict[str, TestOutcome]) -> tuple[str, str, list[str]]:
    """(verdict, why, caught_by) for one mutant's run."""
    tests = [outcomes.get(t) or TestOutcome(t, "missing") for t in mutant.tests]
    ran_mutant = any(mutant.name in t.identities for t in tests)
    foreign = sorted({i for t in tests for i in t.identities} - {mutant.name})
    caught = [t.nodeid for t in tests
              if t.outcome == "failed" and mutant.breaks in (
                  *([] if t.own_clause_passed else [t.clause]), *t.also_failed)]
    broken = [f"{t.nodeid}: {t.outcome} {t.message}".strip() for t in tests
              if t.outcome in ("error", "missing")]
    if foreign:
        return "broken", f"the guest ran {foreign}, not the mutant", caught
    if caught and ran_mutant:
        return "killed", f"{len(caught)} of {len(tests)} test(s) of {mutant.breaks} failed", caught
    if broken:
        return "broken", "; ".join(broken), caught
    if not ran_mutant:
        return "broken", "no test connected to the mutant runtime (no hello named it)", caught
    other = [t.nodeid for t in tests if t.outcome == "failed"]
    if other:
        return "survived", f"failed only tests not marked {mutant.breaks}: {other}", caught
    return "survived", "every selected test passed or skipped", caught


def judge_reference(nodeids: list[str], outcomes: dict[str, TestOutcome]) -> tuple[str, str]:
    tests = [outcomes.get(t) or TestOutcome(t, "missing") for t in nodeids]
    foreign = sorted({i for t in tests for i in t.identities} - {REFERENCE})
    if foreign:
        return "broken", f"the guest ran {foreign}, not the reference runtime"
    bad = [f"{t.nodeid}: {t.outcome} {t.message}".strip() for t in tests if t.outcome != "passed"]
    if any(t.outcome in ("failed", "skipped") for t in tests):  # a finding, even beside an error
        return "failed", "; ".join(bad)
    if bad:
        return "broken", "; ".join(bad)
    return "passed", f"all {len(tests)} test(s) passed"


# -- running pytest ------------------------------------------------------------------------------

def child_env() -> dict[str, str]:
    """The parent's environment without pytest/xdist worker state."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith("PYTEST_XDIST") or k in ("PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"))}


def run_pytest(label: str, nodeids: list[str], module: str | None, out: Path, host: str,
               timeout_s: float) -> tuple[dict[str, TestOutcome] | None, float, int | None, str]:
    """One pytest process; (outcomes or None, wall seconds, exit code or None, problem)."""
    junit = out / "junit" / f"{label}.xml"
    log = out / "logs" / f"{label}.log"
    argv = [sys.executable, "-m", "pytest", *nodeids, "-p", PROBE_PLUGIN, "-p", "no:cacheprovider",
            "-rA", f"--host={host}", f"--junitxml={junit}"]
    if module:
        argv.append(f"--runtime-module={module}")
    started = time.monotonic()
    with log.open("w") as fh:
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        proc = subprocess.Popen(argv, cwd=CHECKOUT, env=child_env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
            problem = ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # pytest stops its VMs on Ctrl-C
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code, problem = None, f"pytest ran past {timeout_s:.0f} s and was stopped"
    wall = round(time.monotonic() - started, 1)
    if not junit.exists():
        return None, wall, code, problem or f"pytest wrote no JUnit XML (exit {code}; see {log})"
    try:
        return read_junit(junit), wall, code, problem
    except ET.ParseError as exc:
        return None, wall, code, f"unreadable JUnit XML {junit}: {exc}"


def run_mutant(mutant: Mutant, out: Path, host: str, timeout_s: float) -> RunResult:
    outcomes, wall, code, problem = run_pytest(mutant.name, list(mutant.tests), mutant.module, out,
                                               host, timeout_s)
    if outcomes is None or problem:
        verdict, why, caught = "broken", problem, []
        tests = list((outcomes or {}).values())
    else:
        verdict, why, caught = judge_mutant(mutant, outcomes)
        tests = [outcomes.get(t) or TestOutcome(t, "missing") for t in mutant.tests]
    return RunResult(mutant.name, mutant.module, mutant.breaks, mutant.how, verdict, why, caught,
                     wall, code, tests)


def run_reference(nodeids: list[str], out: Path, host: str, timeout_s: float) -> RunResult:
    outcomes, wall, code, problem = run_pytest(REFERENCE, nodeids, None, out, host, timeout_s)
    if outcomes is None or problem:
        verdict, why = "broken", problem
        tests = list((outcomes or {}).values())
    else:
        verdict, why = judge_reference(nodeids, outcomes)
        tests = [outcomes.get(t) or TestOutcome(t, "missing") for t in nodeids]
    return RunResult(REFERENCE, "hilconform.runtime", None, "the reference runtime", verdict, why, [],
                     wall, code, tests)


# -- report --------------------------------------------------------------------------------------

def exit_code(results: list[RunResult]) -> int:
    if any(r.verdict in ("survived", "failed") for r in results):
        return EXIT_SURVIVED
    if any(r.verdict == "broken" for r in results):
        return EXIT_BROKEN
    return EXIT_OK


def qemu_of(junit_dir: Path) -> str:
    """The QEMU the runs' hosts used, as the plugin recorded it (JUnit testsuite property
    `qemu_version`); "none" when no run had an emulated host."""
    versions = set()
    for path in sorted(junit_dir.glob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        versions |= {p.get("value") for p in root.iter("property") if p.get("name") == "qemu_version"}
    versions.discard(None)
    return ", ".join(sorted(versions)) or "none recorded"


def environment(host: str, load_before: float, junit_dir: Path) -> dict:
    """Where the table was measured; the 1-min load average before and after (timing clauses)."""
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "host": host,
            "qemu": qemu_of(junit_dir), "cores": os.cpu_count(), "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1)}


def markdown(results: list[RunResult], env: dict, wall_s: float) -> str:
    mutants = [r for r in results if r.name != REFERENCE]
    killed = sum(r.verdict == "killed" for r in mutants)
    lines = [
        f"Measured {env['date']} on host `{env['host']}`, QEMU {env['qemu']}, {env['cores']} cores "
        f"(1-min load {env['load_before']} before, {env['load_after']} after); "
        f"wall time {wall_s / 60:.1f} min. {killed} of {len(mutants)} mutants killed.",
        "",
        "| mutant | breaks | what it does wrong | caught by (failed tests) | verdict | run s |",
        "|---|---|---|---|---|---|",
    ]
    for r in mutants:
        caught = "<br>".join(f"`{c.split('/')[-1]}`" for c in r.caught_by) or "—"
        verdict = r.verdict if r.verdict == "killed" else f"**{r.verdict.upper()}**: {r.why}"
        lines.append(f"| `{r.name}` | {r.breaks} | {r.how} | {caught} | {verdict} | {r.wall_s:.0f} |")
    for r in results:
        if r.name == REFERENCE:
            lines += ["", f"Converse: the reference runtime on the union of the selections "
                          f"({len(r.tests)} tests): **{r.verdict}** ({r.why}; {r.wall_s:.0f} s)."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: list[RunResult], env: dict, wall_s: float) -> None:
    data = {"environment": env, "wall_s": round(wall_s, 1), "exit_code": exit_code(results),
            "results": [asdict(r) for r in results]}
    (out / "sensitivity.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "sensitivity.md").write_text("# Suite sensitivity: mutant runtimes\n\n"
                                        + markdown(results, env, wall_s))


def update_doc(doc: Path, table: str) -> None:
    """Replace what lies between the doc's table markers with ``table``."""
    text = doc.read_text()
    start, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if start < 0 or end < start:
        raise CatalogueError(f"{doc}: no {TABLE_BEGIN} ... {TABLE_END} markers")
    doc.write_text(text[:start + len(TABLE_BEGIN)] + "\n" + table + text[end:])


# -- main ----------------------------------------------------------------------------------------

def select(mutants: list[Mutant], names: list[str] | None, full: bool,
           host: str | None = None, under_load: bool = False) -> list[Mutant]:
    """The mutants asked for by name, else every one (--full) or the CI subset; without names,
    a mutant whose catalogue entry names `hosts` runs only on those, and one marked `under_load`
    only in a run under CPU load (`under_load`: benchmarks/loaded_gate.py): idle it is the
    reference, and its survival there would prove nothing."""
    if names:
        known = {m.name: m for m in mutants}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise CatalogueError(f"unknown mutant(s) {unknown}; known: {sorted(known)}")
        return [known[n] for n in names]
    chosen = mutants if full else [m for m in mutants if m.ci]
    return [m for m in chosen if (not m.hosts or host is None or host in m.hosts)
            and (under_load or not m.under_load)]


def elsewhere(mutants: list[Mutant], chosen: list[Mutant]) -> list[Mutant]:
    """The mutants left out because they are shown on other hosts, or only under CPU load."""
    return [m for m in mutants if (m.hosts or m.under_load) and m not in chosen]


def union(mutants: list[Mutant]) -> list[str]:
    return list(dict.fromkeys(t for m in mutants for t in m.tests))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the table, JUnit and logs")
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE,
                        help=f"the mutant catalogue (default: {CATALOGUE.relative_to(CHECKOUT)})")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--full", action="store_true", help="every mutant (default: the CI subset)")
    group.add_argument("--mutant", nargs="+", metavar="NAME", help="only these mutants")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference run")
    parser.add_argument("--reference-only", action="store_true",
                        help="only the reference run, on the union of the selected mutants' tests")
    parser.add_argument("--jobs", type=int, default=2, help="pytest runs at once (default 2)")
    parser.add_argument("--host", default="emulated:a100-stock")
    parser.add_argument("--doc", type=Path, help="also write the table into this markdown file")
    parser.add_argument("--under-load", action="store_true",
                        help="the caller loads the machine (benchmarks/loaded_gate.py): also run the "
                             "mutants marked under_load, which idle behave as the reference")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"limit per pytest run (default {DEFAULT_TIMEOUT_S})")
    args = parser.parse_args(argv)
    if args.no_reference and args.reference_only:
        parser.error("--no-reference and --reference-only exclude each other")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    try:
        catalogue = load_catalogue(args.catalogue)
        chosen = select(catalogue, args.mutant, args.full, args.host, args.under_load)
    except CatalogueError as exc:
        print(f"self-check: {exc}", file=sys.stderr)
        return EXIT_BROKEN
    if args.doc and not all(m in (args.doc.read_text() if args.doc.is_file() else "")
                            for m in (TABLE_BEGIN, TABLE_END)):
        print(f"self-check: --doc {args.doc}: no file with {TABLE_BEGIN} ... {TABLE_END}",
              file=sys.stderr)
        return EXIT_BROKEN
    if not args.mutant:
        for mutant in elsewhere(catalogue if args.full else [m for m in catalogue if m.ci], chosen):
            if mutant.hosts and args.host not in mutant.hosts:
                where = f"it is shown on {', '.join(mutant.hosts)}"
            else:
                where = f"it misbehaves only under CPU load: benchmarks/loaded_gate.py --mutant {mutant.name}"
            print(f"self-check: {mutant.name}: left out on {args.host}; {where}", flush=True)
    out = args.out.resolve()
    for sub in ("junit", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)

    started, load_before = time.monotonic(), os.getloadavg()[0]
    jobs = [] if args.reference_only else [
        (lambda m=m: run_mutant(m, out, args.host, args.timeout_s)) for m in chosen]
    if not args.no_reference:
        # first: the longest run, so it overlaps the mutants instead of trailing them
        jobs.insert(0, lambda: run_reference(union(chosen), out, args.host, args.timeout_s))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(job) for job in jobs]
        results = []
        for future in futures:
            result = future.result()
            results.append(result)
            print(f"self-check: {result.name}: {result.verdict} ({result.wall_s:.0f} s) {result.why}",
                  flush=True)
    results.sort(key=lambda r: (r.name == REFERENCE, [m.name for m in chosen].index(r.name)
                                if r.name != REFERENCE else 0))
    wall = time.monotonic() - started
    env = environment(args.host, load_before, out / "junit")
    write_report(out, results, env, wall)
    if args.doc:
        update_doc(args.doc, markdown(results, env, wall))
    code = exit_code(results)
    print(f"self-check: wrote {out / 'sensitivity.md'}; exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
