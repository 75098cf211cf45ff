#!/usr/bin/env python3
"""Flip rate: how often clause verdicts of the reference runtime change between whole certify runs.

Issue 32, part 3: the unchanged reference runtime, both hosts `make certify` certifies, idle or
under CPU hogs.

Runs, --runs times back to back, `hilconform certify --host H` for each host (default
emulated:a100, then emulated:a100-stock, as make certify does), idle (--load 0, the default: no
hogs) or under the loaded gate's CPU hogs (--load L: ceil(L) + 1 busy processes, certify_runs.py,
after the 1-minute load average reached L; --hogs N fewer, which leave part of the load to
certify's own VMs). The load average is sampled every 10 s of each run: a run is "at load >= L"
when its median is, and the runs under L are listed. Prints a line per run (wall time, exit,
verdict, load average at its start and end and its median, run folder), then per host and
clause the verdict of every run, every flip with its reason, the wall times (median, min, max)
and the totals; writes the same as JSON (--out FILE, rewritten after every run) and a markdown
table for the README beside it (FILE with .md).

A flip is a clause whose verdict differs between runs, or, the reference runtime being certified,
any verdict but `pass`; its reason is the message of each test of the clause that did not pass,
from that run's certificate.json, and the run folder. A run that crashed, was stopped (deadline,
Ctrl-C) or left no certificate is incomplete (certify_runs.py), never a pass: every clause without
a verdict in it reads `missing`, a flip whose reason is the run's. The benchmark starts and ends
only its own processes (its hogs, its certify runs), also on Ctrl-C, which ends the run in
progress in order (certify stops its VMs) and keeps what was measured.

Exit 0: every run conformant with 0 flips; 1: a flip or an incomplete run; 130: interrupted.
Usage: benchmarks/flip_rate.py [--runs 10] [--load 0] [--host H ...] [--suite AREA ...]
       [--max-minutes 30] [--runs-dir DIR] [--out FILE.json]
e.g.   .venv/bin/python benchmarks/flip_rate.py --runs 10            (idle)
       .venv/bin/python benchmarks/flip_rate.py --runs 5 --load 6    (7 CPU hogs)
       .venv/bin/python benchmarks/flip_rate.py --runs 5 --load 6 --hogs 4   (4, and certify's VMs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from certify_runs import (
    MAKE_CERTIFY_HOSTS,
    MAX_MINUTES,
    CertifyRun,
    certify,
    hog_count,
    interrupt_on_sigterm,
    load,
    start_hogs,
    stop_hogs,
    wait_for_load,
)

from hilconform.reports.certificate import tool_versions

DEFAULT_HOSTS = MAKE_CERTIFY_HOSTS
PASS = "pass"
MISSING = "missing"  # the run has no verdict for the clause: no certificate, or the clause is not in it
CODES = {
    "pass": "P",
    "fail": "F",
    "broken": "B",
    "incomplete": "I",
    "inconclusive": "?",
    "not_checked": "S",
    "not_run": "N",
    MISSING: "-",
}
LEGEND = "P pass, F fail, B broken, I incomplete, ? inconclusive, S not checked, N not run, - no verdict"
MESSAGE_CHARS = 240


# -- judging ---------------------------------------------------------------------------------------


@dataclass
class Flip:
    host: str
    clause: str
    verdicts: list[str]  # one per run, in run order
    reasons: list[dict]  # per run whose verdict is not `pass`: run, verdict, folder, why, tests


def _test_name(nodeid: str) -> str:
    """`suites/discovery/test_disc04.py::test_storm[acpi]` -> `test_disc04.py::test_storm[acpi]`."""
    path, sep, rest = nodeid.partition("::")
    return Path(path).name + sep + rest


def clause_reason(run: CertifyRun, clause: str) -> dict:
    """Why `clause` did not pass in `run`: the run folder, the tests of the clause that did not pass
    (nodeid, outcome, message from the certificate) and a one-line `why`."""
    entry = next((c for c in (run.certificate or {}).get("clauses", []) if c["id"] == clause), None)
    tests = [
        {"nodeid": t["nodeid"], "outcome": t["outcome"], "message": t["message"]}
        for t in (entry or {}).get("tests", [])
        if t["outcome"] != "passed"
    ]
    parts = []
    for test in tests:
        message = " ".join(test["message"].split())
        if len(message) > MESSAGE_CHARS:
            message = message[: MESSAGE_CHARS - 3] + "..."
        parts.append(f"{_test_name(test['nodeid'])}: {test['outcome']}" + (f": {message}" if message else ""))
    if entry is None and run.certificate is not None:
        parts.append("the clause is not in this run's certificate")
    elif entry is not None and not tests:
        parts.append("no test of the clause reported")
    if run.problem:
        parts.append(f"run incomplete: {run.problem}")
    return {
        "run": run.index,
        "verdict": entry["verdict"] if entry else MISSING,
        "folder": str(run.folder or run.out),
        "why": "; ".join(parts),
        "tests": tests,
    }


def clauses_of(runs: list[CertifyRun]) -> list[str]:
    """Every clause any run has a verdict for, in the certificates' (spec) order."""
    return list(dict.fromkeys(c for run in runs for c in run.clause_verdicts()))


def find_flips(runs: list[CertifyRun], reference: bool = True) -> list[Flip]:
    """One host's runs, in order: the clauses whose verdict differs between them or, when the
    reference runtime is certified, is anything but `pass` in one of them."""
    per_run = [run.clause_verdicts() for run in runs]
    flips = []
    for clause in clauses_of(runs):
        verdicts = [verdicts.get(clause, MISSING) for verdicts in per_run]
        if len(set(verdicts)) > 1 or (reference and any(v != PASS for v in verdicts)):
            reasons = [clause_reason(run, clause) for run, v in zip(runs, verdicts, strict=True) if v != PASS]
            flips.append(Flip(runs[0].host, clause, verdicts, reasons))
    return flips


def wall_times(runs: list[CertifyRun]) -> dict:
    seconds = [run.seconds for run in runs]
    if not seconds:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)}


def host_summary(host: str, runs: list[CertifyRun], reference: bool = True) -> dict:
    """Everything the report says of one host's runs."""
    verdicts = Counter(v for run in runs for v in run.clause_verdicts().values())
    return {
        "host": host,
        "runs": [run.summary() for run in runs],
        "clauses": {c: [run.clause_verdicts().get(c, MISSING) for run in runs] for c in clauses_of(runs)},
        "flips": [asdict(flip) for flip in find_flips(runs, reference)],
        "wall_s": wall_times(runs),
        "run_verdicts": dict(Counter(run.verdict for run in runs)),
        "incomplete_runs": [run.index for run in runs if run.verdict == "incomplete"],
        "inconclusive": verdicts["inconclusive"],
        "failed": verdicts["fail"],
    }


def totals(summaries: list[dict]) -> dict:
    return {
        "runs": sum(len(s["runs"]) for s in summaries),
        "flips": sum(len(s["flips"]) for s in summaries),
        "inconclusive": sum(s["inconclusive"] for s in summaries),
        "failed": sum(s["failed"] for s in summaries),
        "incomplete_runs": sum(len(s["incomplete_runs"]) for s in summaries),
    }


# -- reporting -------------------------------------------------------------------------------------


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.2f}"


def _wall(summary: dict) -> str:
    wall = summary["wall_s"]
    return f"median {_minutes(wall['median'])} min (min {_minutes(wall['min'])}, max {_minutes(wall['max'])})"


def _run_verdicts(summary: dict) -> str:
    return ", ".join(f"{n} {verdict}" for verdict, n in sorted(summary["run_verdicts"].items())) or "no runs"


def grouped(flips: list[dict]) -> list[dict]:
    """Flips of one host with the same reasons as one (a run without certificate flips every clause):
    `clause` then names them all, comma-separated."""
    groups: dict[tuple, dict] = {}
    for flip in flips:
        key = (flip["host"], json.dumps(flip["reasons"], sort_keys=True))
        if key in groups:
            groups[key]["clause"] += f", {flip['clause']}"
        else:
            groups[key] = dict(flip)
    return list(groups.values())


def flip_lines(flip: dict) -> list[str]:
    codes = " ".join(CODES.get(v, v) for v in flip["verdicts"])
    lines = [f"  {flip['host']} {flip['clause']}: {codes}"]
    for reason in flip["reasons"]:
        lines.append(f"    run {reason['run']} {reason['verdict']}: {reason['why']}")
        lines.append(f"      {reason['folder']}")
    return lines


def host_lines(summary: dict) -> list[str]:
    """Per clause the verdict of every run, flips marked."""
    flipped = {f["clause"] for f in summary["flips"]}
    lines = [
        f"== {summary['host']}: {len(summary['runs'])} runs: {_run_verdicts(summary)}; "
        f"wall {_wall(summary)}; {len(summary['clauses'])} clauses, {len(flipped)} flipped",
        f"   verdict per run ({LEGEND}):",
    ]
    for clause, verdicts in summary["clauses"].items():
        codes = " ".join(CODES.get(v, v) for v in verdicts)
        lines.append(f"   {clause:<8} {codes}" + ("   <- flip" if clause in flipped else ""))
    return lines


def text_report(report: dict) -> str:
    lines = []
    for summary in report["hosts"]:
        lines += host_lines(summary)
    flips = [flip for summary in report["hosts"] for flip in summary["flips"]]
    lines.append(f"flips: {len(flips)}")
    for flip in grouped(flips):
        lines += flip_lines(flip)
    t = report["totals"]
    lines.append(
        f"totals: {t['runs']} runs, {t['incomplete_runs']} incomplete; flips {t['flips']}, "
        f"inconclusive {t['inconclusive']}, failed {t['failed']}"
    )
    return "\n".join(lines)


def _load_range(runs: list[dict]) -> str:
    """The runs' median load averages: their median (lowest-highest)."""
    medians = [r.get("load_median", (r["load_start"] + r["load_end"]) / 2) for r in runs]
    if not medians:
        return "-"
    return f"{statistics.median(medians):.2f} ({min(medians):.2f}-{max(medians):.2f})"


def below_target(runs: list[dict], target: float) -> list[dict]:
    """The runs whose median load stayed under the series' target: not runs "at load >= target"."""
    return [r for r in runs if target > 0 and r.get("load_median", 0.0) < target]


def markdown(report: dict) -> str:
    """A short table for the README: a row per host and one for both, then the flips, one line each."""
    t = report["totals"]
    every_run = [r for s in report["hosts"] for r in s["runs"]]
    lines = [
        f"Flip rate at {report['commit']} ({report['started']} - {report['finished'] or 'unfinished'}, "
        f"{report['cpus']} CPUs, {report['mode']}{', interrupted' if report['interrupted'] else ''}):",
        "",
        "| host | runs | verdicts | clauses | wall min: median (min-max) | "
        "load, run medians: median (min-max) | flips | "
        "inconclusive | failed | incomplete runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["hosts"]:
        wall = s["wall_s"]
        minutes = f"{_minutes(wall['median'])} ({_minutes(wall['min'])}-{_minutes(wall['max'])})"
        lines.append(
            f"| {s['host']} | {len(s['runs'])} | {_run_verdicts(s)} | {len(s['clauses'])} | "
            f"{minutes if s['runs'] else '-'} | "
            f"{_load_range(s['runs'])} | {len(s['flips'])} | {s['inconclusive']} | {s['failed']} | "
            f"{len(s['incomplete_runs'])} |"
        )
    lines.append(
        f"| all | {t['runs']} | | | | {_load_range(every_run)} | {t['flips']} | {t['inconclusive']} | "
        f"{t['failed']} | {t['incomplete_runs']} |"
    )
    low = below_target(every_run, report.get("load_target", 0.0))
    if low:
        lines += [
            "",
            f"Under the target load {report['load_target']:g}: "
            + ", ".join(f"{r['host']} run {r['index']} (median {r['load_median']:.2f})" for r in low),
        ]
    flips = grouped([flip for s in report["hosts"] for flip in s["flips"]])
    if flips:
        lines.append("")
    for flip in flips:
        why = "; ".join(f"run {r['run']} {r['verdict']}: {r['why']}" for r in flip["reasons"])
        lines.append(f"- {flip['host']} {flip['clause']} ({' '.join(flip['verdicts'])}): {why}")
    return "\n".join(lines) + "\n"


def build_report(runs: list[CertifyRun], hosts: list[str], meta: dict) -> dict:
    summaries = [host_summary(host, [r for r in runs if r.host == host]) for host in hosts]
    return {**meta, "hosts": summaries, "totals": totals(summaries)}


def write_report(report: dict, out: Path) -> Path:
    """The JSON at `out` and the markdown beside it (.md); returns the markdown's path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)
    md = out.with_suffix(".md")
    md.write_text(markdown(report))
    return md


def _utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


# -- running ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="whole rounds (every host once each)")
    parser.add_argument(
        "--load",
        type=float,
        default=0.0,
        help="the 1-minute load average each run is to be made at (its median, "
        "sampled every 10 s; runs under it are listed); 0: idle, no hogs",
    )
    parser.add_argument(
        "--hogs",
        type=int,
        default=None,
        help="CPU hogs to start (default: ceil(--load) + 1, which bring the load to "
        "--load before the first run; fewer leave part of it to certify's VMs)",
    )
    parser.add_argument(
        "--host", action="append", default=None, help=f"repeatable (default: {' '.join(DEFAULT_HOSTS)})"
    )
    parser.add_argument("--suite", action="append", default=[], help="repeatable (default: every suite)")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=MAX_MINUTES,
        help="certify's deadline per run; past it the run is incomplete",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="where the run folders go (default: a new folder under /tmp)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON report (default: RUNS_DIR/flip-rate.json); the markdown goes beside it (.md)",
    )
    args = parser.parse_args(argv)
    hosts = args.host or DEFAULT_HOSTS
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="hilc-flip-rate-"))
    out = args.out or runs_dir / "flip-rate.json"
    hog_n = args.hogs if args.hogs is not None else hog_count(args.load)
    mode = f"load >= {args.load:g} ({hog_n} CPU hogs, and certify's own VMs)" if hog_n else "idle (no hogs)"
    meta = {
        "benchmark": "flip_rate",
        "commit": tool_versions()["hilconform_checkout"],
        "cpus": os.cpu_count(),
        "mode": mode,
        "load_target": args.load,
        "hogs": hog_n,
        "hosts_order": hosts,
        "runs_per_host": args.runs,
        "suites": args.suite,
        "runs_dir": str(runs_dir),
        "started": _utc(),
        "finished": None,
        "interrupted": False,
        "load_before": round(load(), 2),
    }
    interrupt_on_sigterm()
    print(
        f"hilconform flip rate: {args.runs} x certify {', '.join(hosts)}"
        f"{''.join(' --suite ' + s for s in args.suite)}; {mode}; {os.cpu_count()} CPUs; load "
        f"{meta['load_before']:.2f} before; at {meta['commit']}; run folders under {runs_dir}",
        flush=True,
    )
    runs: list[CertifyRun] = []
    hogs = []
    try:
        hogs = start_hogs(hog_n)
        if hogs:
            settled = wait_for_load(min(args.load, 0.9 * len(hogs)))
            print(f"{len(hogs)} CPU hogs started; load average {settled:.2f}", flush=True)
        for index in range(1, args.runs + 1):
            for host in hosts:
                slug = "".join(ch if ch.isalnum() else "-" for ch in host)
                run = certify(
                    host,
                    runs_dir / f"run-{index:02d}-{slug}",
                    index,
                    args.suite,
                    max_minutes=args.max_minutes,
                )
                runs.append(run)
                print(run.line(args.runs), flush=True)
                write_report(build_report(runs, hosts, meta), out)
                if run.interrupted:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        meta["interrupted"] = True
        print("\ninterrupted: reporting the runs made so far", flush=True)
    finally:
        stop_hogs(hogs)
    if hogs:
        print(f"hogs stopped; load average {load():.2f}", flush=True)
    meta["finished"] = _utc()
    report = build_report(runs, hosts, meta)
    md = write_report(report, out)
    print(text_report(report))
    print(f"wrote {out} and {md}; for the README:\n")
    print(markdown(report), end="")
    if meta["interrupted"]:
        return 130
    t = report["totals"]
    return 1 if t["flips"] or t["incomplete_runs"] or not t["runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
