"""The `hilconform` command: `certify` a host, `report` on run folders (diff, allure, rebuild), and
`lab report` on nights of lab runs (the fleet report).

Exit codes (also in `hilconform --help`):
  0  conformant (or partial: some clauses not checked because the host lacks a capability)
  1  a clause failed (a definitive finding; wins over infrastructure errors in the same run)
  2  infrastructure error, bad input, or an interrupted run (the certificate says "incomplete")
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
from pathlib import Path

from hilconform.fixtures.labgrid_lab import coordinator_address

from . import allure_files
from .certificate import CertificateInvalid
from .certify import (
    EMULATED_WORKERS,
    CertifyError,
    CertifyOptions,
    available_suites,
    certify,
    finish,
)
from .diff import IncomparableRuns, diff_runs
from .fleet import BadFleet, write_fleet_report
from .lab_night import BadNight
from .lab_run import LabRunError, LabRunOptions, lab_run, parse_tags
from .run_folder import NotARunFolder, RunFolder

EXIT_CODES = """exit codes:
  0  conformant: every clause in scope passed, or "partial": none failed or broke but some were not
     checked (every test of theirs skipped: the host lacks a capability); the certificate lists them
  1  nonconformant: a clause failed (a definitive finding; it wins over infrastructure errors)
  2  incomplete or unusable: an infrastructure error (QEMU died, no image, ...), bad input (unknown host,
     suite or clause; not a run folder; another certificate schema version), or an interrupted run
"""


def _add_lab_and_selection(parser: argparse.ArgumentParser, coordinator: str, suite: str,
                           clause: str) -> None:
    """--lg-coordinator, --suite and --clause: one definition for `certify` and `lab run`, which
    passes them on to each certify."""
    parser.add_argument("--lg-coordinator", metavar="HOST[:PORT]", help=coordinator)
    parser.add_argument("--suite", action="append", default=[], metavar="AREA", help=suite)
    parser.add_argument("--clause", action="append", default=[], metavar="ID", help=clause)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hilconform",
        description="Certify a host's device runtime and report on certification runs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "certify",
        help="run the conformance suites and write a run folder",
        description="Run the conformance suites against a host (pytest, parallel workers), print a line per "
        "finished test, and write reports/<run-id>/: junit.xml, allure-results/, "
        "certificate.json, report.html. Arguments after `--` go to pytest as they are, "
        "e.g. `-- --hotplug-mode acpi`.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--host", required=True, metavar="KIND:NAME",
                     help="host to certify, e.g. emulated:a100, real:ssh://root@gpu1, labgrid:PLACE")
    _add_lab_and_selection(
        run, "labgrid coordinator of a labgrid:PLACE host (default $LG_COORDINATOR, else 127.0.0.1:20408); "
        "the place is held for the run and given back (docs/lab.md)",
        "run only this area's suite (repeatable; default: every area but smoke)",
        "run only the tests of this clause, e.g. DISC-01 (repeatable)")
    run.add_argument(
        "--out",
        type=Path,
        default=Path("reports"),
        metavar="DIR",
        help="where the run folder is made (default: reports/ in the current folder)",
    )
    run.add_argument(
        "-n",
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help=f"parallel pytest workers, one VM each (default {EMULATED_WORKERS} on an emulated host, 1 on a "
        "real host, which runs one runtime; 0 = no xdist)",
    )
    run.add_argument(
        "--runtime-module",
        metavar="MODULE",
        help="python module the guest runs as the device runtime (default: the reference one)",
    )
    run.add_argument(
        "--self-check",
        action="store_true",
        help="after the run, measure the suites' sensitivity (python -m "
        "hilconform.reports.self_check --full) and add it to the certificate",
    )
    run.add_argument(
        "--max-minutes",
        type=float,
        default=180.0,
        metavar="M",
        help="deadline of the whole run; past it the run is stopped as incomplete (default 180)",
    )

    setup = commands.add_parser(
        "setup",
        help="set up this machine for emulated hosts: system packages, guest image, QEMU",
        description="Install the system packages emulated hosts need (as root; otherwise print the apt "
        "line), and build the guest image and the QEMU with the vfio-user client into the cache folder "
        "($XDG_CACHE_HOME/hilconform, or HILCONFORM_BUILD_DIR; a source checkout: vm-images/build), "
        "each only when missing or its recipe changed. Exit 0 ready, 1 something missing, 2 a step failed.",
    )
    setup.add_argument("--check", action="store_true", help="only say what is missing (as `doctor`)")
    commands.add_parser("doctor", help="say what `setup` would still have to do (changes nothing)")

    report = commands.add_parser(
        "report",
        help="read run folders: diff, allure, rebuild",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = report.add_subparsers(dest="action", required=True, metavar="ACTION")
    diff = actions.add_parser("diff", help="which clause verdicts and figures changed between two runs")
    diff.add_argument("run_a", type=Path, metavar="RUN_A")
    diff.add_argument("run_b", type=Path, metavar="RUN_B")
    allure = actions.add_parser("allure", help="render the run's Allure report (needs the allure tool)")
    allure.add_argument("run", type=Path, metavar="RUN")
    rebuild = actions.add_parser(
        "rebuild", help="rebuild certificate.json and report.html from the run's files"
    )
    rebuild.add_argument("run", type=Path, metavar="RUN")

    lab = commands.add_parser("lab", help="nightly lab runs: report on a night and the nights before it")
    lab_commands = lab.add_subparsers(dest="lab_action", required=True, metavar="ACTION")
    # each lab action names its handler (args -> exit code): a new action is one parser and one function
    lab_report = lab_commands.add_parser(
        "report",
        help="write fleet.json and fleet.html (hosts x clauses, nights side by side, trends)",
        description="Read NIGHT_DIR/lab-run.json and the run folders it names (and those of the previous "
        "nights given) and write fleet.json and fleet.html into NIGHT_DIR (docs/fleet-report.md). "
        "Exit 0 written, 2 a missing or malformed night.",
    )
    lab_report.add_argument("night_dir", type=Path, metavar="NIGHT_DIR")
    lab_report.add_argument("previous", type=Path, nargs="*", metavar="PREVIOUS_NIGHT_DIR")
    lab_report.add_argument("--out", type=Path, metavar="DIR", help="write here instead of NIGHT_DIR")
    lab_report.set_defaults(lab_handler=_lab_report)
    lab_run = lab_commands.add_parser(
        "run",
        help="certify every labgrid place with the given tags, each under its lock; write the night",
        description="For every labgrid place whose tags include TAG=VALUE...: skip it when another user "
        "holds it (the holder named), reserve it (within --reserve-timeout), lock it, run `hilconform "
        "certify --host labgrid:PLACE --out NIGHT_DIR/PLACE`, release it; up to --max-parallel at a "
        "time. Writes NIGHT_DIR/lab-run.json, fleet.json and fleet.html (docs/lab.md). Arguments after "
        "`--` go to each certify's pytest, e.g. `-- --ssh-config FILE`. Exit: the worst host's status.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lab_run.add_argument("tags", nargs="+", metavar="TAG=VALUE", help="place tags to match, e.g. gpu=a100")
    _add_lab_and_selection(lab_run, "labgrid coordinator (default $LG_COORDINATOR, else 127.0.0.1:20408)",
                           "passed to each certify (repeatable)", "passed to each certify (repeatable)")
    lab_run.add_argument("--out", type=Path, metavar="NIGHT_DIR",
                         help="the night's folder (default lab-nights/<UTC date and time> here)")
    lab_run.add_argument("--max-parallel", type=int, default=1, metavar="N",
                         help="hosts certified at the same time (default 1)")
    lab_run.add_argument("--reserve-timeout", type=float, default=300.0, metavar="S",
                         help="how long a place's reservation may wait to be allocated (default 300 s)")
    lab_run.add_argument("--previous", action="append", type=Path, default=[], metavar="NIGHT_DIR",
                         help="an earlier night for the fleet report's comparison (repeatable)")
    lab_run.set_defaults(lab_handler=_lab_run)
    return parser


def _lab_run(args, pytest_args: list[str]) -> int:
    if args.max_parallel < 1:
        raise LabRunError(f"--max-parallel {args.max_parallel}: at least 1")
    out = args.out or Path("lab-nights") / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    options = LabRunOptions(tags=parse_tags(args.tags), coordinator=coordinator_address(args.lg_coordinator),
                            out=out.resolve(), max_parallel=args.max_parallel,
                            reserve_timeout_s=args.reserve_timeout, suites=args.suite,
                            clauses=args.clause, pytest_args=pytest_args, previous=args.previous)
    return lab_run(options)


def _lab_report(args, _pytest_args: list[str]) -> int:
    json_path, html_path = write_fleet_report(args.night_dir, args.previous, args.out)
    print(json_path)
    print(html_path)
    return 0


def _report(args) -> int:
    if args.action == "diff":
        result = diff_runs(args.run_a, args.run_b)
        print(result.text(str(args.run_a), str(args.run_b)))
        return 0
    run = RunFolder.open(args.run)
    if args.action == "rebuild":
        cert = finish(run, run.read_certificate().get("sensitivity") if run.certificate.exists() else None)
        for reason in cert["reasons"]:
            print(f"hilconform:   {reason}")
        print(f"hilconform: {run.certificate} and {run.html} rebuilt: verdict {cert['verdict'].upper()}")
        return 0
    command = allure_files.render_command(run.allure_results)
    if command is None:
        print(
            "hilconform: the Allure renderer (`allure`) is not installed; the raw results are in "
            f"{run.allure_results} (any Allure 2 installation renders them: allure serve DIR)",
            file=sys.stderr,
        )
        return 2
    print("hilconform: " + " ".join(command))
    return subprocess.run(command, check=False).returncode and 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = _parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        if args.command == "certify":
            options = CertifyOptions(
                host=args.host,
                suites=args.suite,
                clauses=args.clause,
                out=args.out,
                workers=args.workers,
                runtime_module=args.runtime_module,
                self_check=args.self_check,
                max_minutes=args.max_minutes,
                pytest_args=pytest_args,
                lg_coordinator=args.lg_coordinator,
            )
            return certify(options)
        if args.command in ("setup", "doctor"):  # emulators' code, run as a process (reports/ imports none)
            check = ["--check"] if args.command == "doctor" or args.check else []
            setup = [sys.executable, "-m", "hilconform.emulators.tool_setup", *check]
            return subprocess.run(setup).returncode
        if args.command == "lab":
            return args.lab_handler(args, pytest_args)
        return _report(args)
    except (CertifyError, NotARunFolder, IncomparableRuns, CertificateInvalid, BadNight, BadFleet,
            LabRunError) as exc:
        print(f"hilconform: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hilconform: interrupted", file=sys.stderr)
        return 2
    except Exception:  # a bug here must not exit 1, which means "a clause failed"
        traceback.print_exc()
        print("hilconform: internal error (above); no verdict", file=sys.stderr)
        return 2


__all__ = ["main", "available_suites"]
