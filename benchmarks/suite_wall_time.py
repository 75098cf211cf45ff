#!/usr/bin/env python3
"""Wall time of the whole conformance suite for one profile, and the per-area split.

Runs `pytest suites -n 2 --host emulated:PROFILE` (as `make certify` does)
REPEAT times in a row, reads each run's JUnit XML, and prints: the wall time
of each run, the summed test time per area (suites/<area>/), and whether the
verdicts (test -> passed/failed/error/skipped) were identical across runs.
Goal (issue 4): whole suite <= 10 min at -n 2 on a 2-core machine.
Usage: benchmarks/suite_wall_time.py [--profile a100] [--repeat 3] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def verdicts(junit: Path) -> tuple[dict[str, str], dict[str, float]]:
    outcome, per_area = {}, defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        verdict = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        outcome[name] = verdict
        parts = case.get("classname", "").split(".")
        area = parts[1] if len(parts) > 1 and parts[0] == "suites" else parts[0]
        per_area[area] += float(case.get("time", 0))
    return outcome, per_area


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="a100")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            argv = [sys.executable, "-m", "pytest", "suites", "-n", "2", "-q", "-p",
                    "no:cacheprovider", f"--host=emulated:{args.profile}", f"--junitxml={junit}",
                    *args.pytest_args]
            started = time.monotonic()
            code = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
            wall = time.monotonic() - started
            outcome, per_area = verdicts(junit)
        runs.append(outcome)
        counts = defaultdict(int)
        for verdict in outcome.values():
            counts[verdict] += 1
        print(f"run {index + 1}: wall {wall / 60:.1f} min, exit {code}, "
              + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
        for area, seconds in sorted(per_area.items()):
            print(f"    {area:<12} {seconds:7.1f} s of test time")
    if len(runs) > 1:
        differing = sorted(n for n in runs[0] if any(r.get(n) != runs[0][n] for r in runs[1:]))
        print("verdicts identical across runs" if not differing
              else f"verdicts differ for {len(differing)} test(s): {differing}")


if __name__ == "__main__":
    main()
