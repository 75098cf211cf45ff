#!/usr/bin/env python3
"""Wall time of `hilconform certify` on emulated hosts: today's settings beside the earlier ones.

Runs, for each host (default: emulated:a100 and emulated:a100-stock, the two `make certify`
certifies), `hilconform certify --host H` with its defaults (3 workers, work stealing) and, for
comparison in the same run on the same machine, with the settings before issue 17's last change
(`-n 2`, pytest-xdist's default `load` distribution). Each configuration runs --repeat times,
alternating, one run at a time (nothing else should run: the figures are the machine's). Prints
per run: the configuration, the host, its wall time, exit code and verdict, the 1-minute load
average before and after; then per configuration the whole (both hosts) as median, min and max.

Issue 17's target: make certify (both hosts, after set-up) <= 5 min on 2 cores.
First figures (2026-12-03, 2 cores): docs/performance.md, "make certify".
Usage: benchmarks/certify_wall_time.py [--host emulated:a100 ...] [--repeat 1] [--only current]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from certify_runs import MAKE_CERTIFY_HOSTS, certify, interrupt_on_sigterm

CONFIGURATIONS = {
    "current": [],  # the CLI's defaults
    "before": ["-n", "2", "--", "--dist", "load"],  # 2 workers, tests handed out ahead
}
DEFAULT_HOSTS = MAKE_CERTIFY_HOSTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", action="append", default=None,
                        help=f"repeatable (default: {' '.join(DEFAULT_HOSTS)})")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", choices=sorted(CONFIGURATIONS), default=None)
    args = parser.parse_args()
    hosts = args.host or DEFAULT_HOSTS
    names = [args.only] if args.only else list(CONFIGURATIONS)
    described = ", ".join(f"{n} ({' '.join(CONFIGURATIONS[n]) or 'defaults'})" for n in names)
    print(f"hilconform certify wall time: {', '.join(hosts)}; {os.cpu_count()} CPUs; {described}", flush=True)
    wholes: dict[str, list[float]] = {name: [] for name in names}
    interrupt_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="hilc-certify-bench-") as tmp:
        for index in range(args.repeat):
            for name in names:
                whole = 0.0
                for host in hosts:
                    out = Path(tmp) / f"{name}-{index}-{host.replace(':', '-')}"
                    run = certify(host, out, index + 1, extra=CONFIGURATIONS[name])
                    whole += run.seconds
                    print(f"run {index + 1} {name:<8} {host:<22} {run.seconds / 60:5.2f} min  exit "
                          f"{run.exit_code} {run.verdict}  load {run.load_start:.2f} -> {run.load_end:.2f}",
                          flush=True)
                    if run.interrupted:
                        sys.exit(130)
                wholes[name].append(whole)
    for name in names:
        values = wholes[name]
        print(f"{name:<8} all hosts: median {statistics.median(values) / 60:.2f} min, min "
              f"{min(values) / 60:.2f}, max {max(values) / 60:.2f} (n={len(values)})")


if __name__ == "__main__":
    main()
