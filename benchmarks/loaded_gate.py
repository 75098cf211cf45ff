#!/usr/bin/env python3
"""Benchmark whether the gate holds on a loaded machine: verdicts of consecutive certify runs of
the unchanged reference runtime while CPU hogs load the machine, and the mutants under the same
load (issue 17).

The benchmark starts its own CPU hogs (busy `python3` processes it owns and ends, also on
Ctrl-C), waits until the 1-minute load average reaches --load, then runs `hilconform certify
--host H` --runs times, one after the other, and prints per clause the verdict of every run and
whether it flipped; with --mutant, the self-check of those mutants under the same load.

First figures (2026-12-02 10:33-10:45 UTC, --suite discovery --runs 2, 6 hogs, load 5.9 -> 8.4):
both runs exit 0, DISC-01..06 pass in both (3.3 and 3.6 min), 0 flips.
With restored fresh hosts (2026-12-02 14:17-14:50 UTC, --runs 3, whole certify of emulated:a100,
7 hogs, load 6.06 -> 10.72): runs of 9.4, 8.9 and 7.5 min; 34 clauses, 1 flipped: DISC-04 failed
in run 1 (a storm device 833 ms after its device_add against 750 ms, judged whole) and passed in
runs 2 and 3. DISC-04 has since been judged over the floor as DISC-02 is.
After that (2026-12-02 17:13-18:00 UTC, --runs 5, whole certify of emulated:a100, 7 hogs, load
6.08 -> 9.94): runs of 7.5, 7.2, 6.9, 6.6 and 7.7 min, 34 clauses, DISC-04 and every timed clause
passed in all 5; 1 flip: LIFE-02 failed in run 2, a test race, not a judgement (the test read a
device's record right after releasing its lease, while the runtime's release checkpoint still
held it RELEASED for ~200 ms); the test now waits for the device to leave RELEASED. Mutants
under load (--runs 0 --mutant ..., 18:01-18:08 UTC, load 6.04 -> 8.35): the timed ones,
slow_discovery (DISC-02), cold_start_settle (DISC-03), storm_drops_events (DISC-04),
drain_timeout_3s (HP-03), reset_without_budget (RST-02), late_renewals_dropped and
leases_never_expire (LIFE-04), dp_slow_registration (DP-01): all 8 killed.
2026-12-02 20:30-21:00 UTC (--runs 5, 7 hogs, load 6.04 -> 10.10): 2 flips. DISC-02[native]
failed in run 1: a runtime race, not a judgement (a hot-remove's slot power-off write returned
after the test's next card in that slot was discovered, and the removal's end marked the new card
REMOVED; fixed: a procedure acts on its own device record). LIFE-03 inconclusive in runs 1, 2
and 5: its probe was timed from the injection's verification, which took 100-300 ms under load,
after the kernel's ~160 ms recovery window (fixed: timed from the injection itself).
2026-12-03 02:28-02:52 UTC after those fixes (load 6.07 -> 9.35): 1 flip, LIFE-03 inconclusive in
run 5 (QEMU's reply still reached the loaded controller ~30 ms after the kernel's error line;
now timed from the middle of the injection's round trip, three probers).
2026-12-03 03:14-03:42 UTC (--runs 5, 7 hogs, load 6.02 -> 9.87): runs of 4.7, 5.5, 6.1, 5.4
and 5.4 min, all exit 0, 34 clauses CONFORMANT in every run: 0 flips. Then, same hogs (load
9.87 -> 8.25, 03:42-04:00 UTC), every mutant of tests/mutants/mutants.toml (37) under load:
all 37 killed, each by its clause's test (27-166 s each).
2026-12-03 06:46-07:11 UTC, with one boot per configuration and run, reboots by set-action and the
DP answer window (--runs 5, 7 hogs, load 6.02 -> 9.96): runs of 4.4, 4.7, 4.3, 5.0 and 5.0 min,
all exit 0, 34 clauses in every run: 0 flips; then dp_no_reregistration, dp_listed_once,
dp_never_healthy_again and dp_never_unhealthy under load: all killed (46-98 s).
2026-12-03 09:46-10:16 UTC, with DP hosts restored with the kubelet stand-in running and DP-08/09 on
such hosts (--runs 5, 7 hogs, load 6.05 -> 10.82 at most): runs of 5.4, 5.4, 5.3, 5.4 and 5.3 min,
all exit 0, 34 clauses in every run: 0 flips; then dp_no_reregistration, dp_allocate_missing_nodes
and dp_ids_per_start under load: all killed (42-70 s).
emulated:a100-stock: under make test at -n 3 (load ~3-4, 2026-12-03 07:30) its HP-02 failed once
(drain events 476 ms apart on the runtime's own clock: the guest starved); HP-02 now judges the
runtime's elapsed_ms against the timeout and that interval against timeout + drain_tolerance_ms.
2026-12-03 13:10-13:21 UTC (--host emulated:a100-stock --runs 2, 7 hogs, load 6.04 -> 9.31): runs of
4.2 and 4.2 min, both exit 0, 33 clauses CONFORMANT in both: 0 flips (HP-02's drains 139-146 ms,
step intervals 141-154 ms: the tolerance was not needed there). Two runs, not the target's five.
2026-12-03 15:55-16:05 UTC at e182ed3, after the runtime's idle timers were cut (health checkpoint
from the config header, no lease ticks without leases, 1 s idle select, kernel log woken by a
pipe) and the transport's lost wake fixed (--runs 2, 7 hogs, load 6.07 -> 9.08): runs of 4.0 and
3.9 min, both exit 0, 34 clauses CONFORMANT in both: 0 flips. Two runs, not five.
2026-12-03 18:02-18:12 UTC at 8b86617, shared hosts paused between their tests (--runs 2, 7 hogs,
load 6.07 -> 9.14): 4.2 min CONFORMANT, then 4.0 min exit 2: DISC-05 broken (a restored acpi
guest's udev queue not empty within guest_quiet's 20 s): 1 flip. guest_quiet waits 60 s since
f327b88; at f327b88, 18:16-18:26 UTC (load 6.00 -> 8.84): 3.9 and 3.8 min, both exit 0, 34 clauses
CONFORMANT in both: 0 flips.
Certify at 3 workers (6de40b0). Before the loaded gate: both hosts certified side by side at -n 2
each (four VMs on 2 cores, 19:24 UTC) failed HP-03 on a100 (drain start -> reset 653 ms against
300 +- 150: the guest's virtual CPU starved), so HP-02/HP-03 now judge a late drain interval less
the node's stalls inside it (fixtures/stall_witness.py, 851619b). At 851619b (19:57-20:07, load
6.02 -> 9.38): run 1 exit 0, run 2 exit 2, DISC-02 broken: `udevadm settle --timeout=60` failed
in the guest within ~2 s (the test took 4 s), read as "queue not empty"; since 60ac9fb such a
failure goes on waiting by udevd's /run/udev/queue marker (fixtures/udev_settle.py). At 60ac9fb
(--runs 5, 7 hogs, 20:09-20:32 UTC, load 6.03 -> 11.13 at most): runs of 3.3, 3.2, 3.3, 3.4 and
3.2 min, all exit 0, 34 clauses CONFORMANT in every run: 0 flips (HP-03's stalls inside the
give-up 3-5 ms, HP-02's 0-36 ms). Then the 8 timed mutants under the same hogs (load 10.42 ->
7.57): slow_discovery, cold_start_settle, storm_drops_events, drain_timeout_3s,
reset_without_budget, late_renewals_dropped, leases_never_expire, dp_slow_registration: all
killed (25-134 s each). emulated:a100-stock at bdea0db (--runs 3, 7 hogs, 21:07-21:18 UTC, load
6.03 -> 9.96): runs of 2.9, 3.6 and 2.8 min, all exit 0, 33 clauses CONFORMANT in every run: 0
flips. Three runs, not five.
Target (issue 17): 0 flips in 5 consecutive runs of `hilconform certify --host emulated:a100` at
load average >= 6; every mutant still killed.
The hogs and the certify runs are certify_runs.py's (shared with flip_rate.py, which runs both hosts
idle or loaded); a flip is judged as flip_rate.py does: a clause whose verdict differs between runs
or is not `pass` in one (the reference runtime), printed with the failing test's message and the run
folder; a run that crashed, timed out or left no certificate is incomplete, never a pass.
Usage: benchmarks/loaded_gate.py [--host emulated:a100] [--runs 5] [--load 6] [--suite AREA ...]
       [--mutant NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from certify_runs import (
    CertifyRun,
    certify,
    hog_count,
    interrupt_on_sigterm,
    load,
    run_owned,
    start_hogs,
    stop_hogs,
    wait_for_load,
)
from flip_rate import build_report, text_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="emulated:a100")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load", type=float, default=6.0, help="1-minute load average to reach first")
    parser.add_argument("--hogs", type=int, default=None,
                        help="CPU hogs to start (default: --load + 1; with --load of them the 1-minute "
                             "average only creeps towards --load)")
    parser.add_argument("--suite", action="append", default=[], help="repeatable (default: every suite)")
    parser.add_argument("--mutant", action="append", default=[], help="repeatable: self-check under load")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="hilc-loaded-gate-"))
    print(f"hilconform loaded-gate benchmark: {args.runs} x certify --host {args.host} "
          f"{' '.join('--suite ' + s for s in args.suite)}; {os.cpu_count()} CPUs; load {load():.2f} before "
          f"the hogs; run folders under {out}", flush=True)
    interrupt_on_sigterm()
    hogs = start_hogs(args.hogs if args.hogs is not None else hog_count(args.load))
    runs: list[CertifyRun] = []
    reported = False
    try:
        print(f"{len(hogs)} CPU hogs started; load average {wait_for_load(args.load):.2f}", flush=True)
        for index in range(1, args.runs + 1):
            run = certify(args.host, out / f"run-{index}", index, args.suite)
            runs.append(run)
            print(run.line(args.runs), flush=True)
            if run.interrupted:
                raise KeyboardInterrupt
        print(text_report(build_report(runs, [args.host], {})), flush=True)
        reported = True
        if args.mutant:
            before = load()
            argv = [sys.executable, "-m", "hilconform.reports.self_check", "--host", args.host,
                    "--no-reference", "--under-load", "--out", str(out / "mutants")]
            argv += ["--mutant", *args.mutant]
            (out / "mutants").mkdir(parents=True, exist_ok=True)
            log = out / "mutants" / "self-check.log"
            code, stopped, interrupted = run_owned(argv, log, None)
            lines = [line for line in log.read_text().splitlines() if line.startswith("self-check:")]
            print(f"mutants under load ({before:.2f} -> {load():.2f}), exit {code}"
                  f"{f' ({stopped})' if stopped else ''}:\n  " + "\n  ".join(lines))
            if interrupted:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
        if runs and not reported:
            print(text_report(build_report(runs, [args.host], {})), flush=True)
        sys.exit(130)
    finally:
        stop_hogs(hogs)
        print(f"hogs stopped; load average {load():.2f}")


if __name__ == "__main__":
    main()
