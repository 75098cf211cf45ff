"""DISC-03 cold discovery: runtime start -> inventory complete within `cold_discovery_ms`.

How it is measured (the node's clock, not the controller's): the runtime is restarted on the
node (`host.restart_runtime()`: in the emulated guest, or the runtime deployed on a real host
over SSH); the start is the new process's start time as the node's kernel records it
(/proc/PID/stat `starttime`, 10 ms ticks since boot), the end is the `ts_ns` (the node's
CLOCK_MONOTONIC) of the runtime's `inventory_complete` event. Neither guests nor servers
suspend, so both are on one clock. The controller cannot time this end to end: the new
runtime is reached only after it serves, and events it emitted before the controller
subscribed arrive as a replay. The runtime's own `duration_ms` (enumeration only,
after interpreter start-up) is recorded beside it and must not exceed it.

Judged over the test bed's floor (fixtures/floor_judgement.py): after each start a bare
`python3` importing pyudev is started on the node and times its own start the same way
(`bare_interpreter_start`), with the runtime held stopped (SIGSTOP, then SIGCONT, in the same node
command): a runtime that keeps the node's CPU busy (a spinning thread) would otherwise slow its
own floor and have the share it was judged by shrink. The runtime's share is its cold discovery
less that floor. A profile with `cold_discovery_over_floor_ms` (emulated, TCG: most of a start is
the emulated interpreter's) judges the share, inconclusive when the floor is over
`cold_discovery_floor_limit_ms`, each start and each floor taken less the stalls of the guest's
virtual CPUs inside it (fixtures/stall_witness.py `acting`: a loaded runner stops the guest's CPU
at one moment and not the next, so a floor measured beside a start is not measured during it; the
device models' and backends' waits do not run the start); one with only
`cold_discovery_ms` (real hosts) judges the whole figure. Every start must meet the budget (the
`max` is judged), and each cold discovery must report exactly the managed endpoints the host has
(`host.managed_truth()`: QEMU's bus tree, or a real host's sysfs, with the profile's selection),
each announced by a `discovered` event (cause `boot`) before `inventory_complete`.

The shared host is left as found: the runtime is running with the same configuration
and a complete inventory (the test holds no leases across a restart).
"""

from __future__ import annotations

import pytest
from discovery_support import (
    COLD_DISCOVERY_TIMEOUT_S,
    bare_interpreter_start,
    ms_between,
    subscribe_from_start,
)

from hilconform.fixtures.floor_judgement import FloorBudgets, judge_over_floor
from hilconform.fixtures.node_clock import node_monotonic_ns_of_process_start
from hilconform.fixtures.stall_witness import stalled_ms

pytestmark = [pytest.mark.clause("DISC-03"), pytest.mark.slow]

RESTARTS = 5
TICK_MS = 10.0  # resolution of the process start time (USER_HZ = 100)
BUDGETS = FloorBudgets(absolute="cold_discovery_ms", share="cold_discovery_over_floor_ms",
                       floor_limit="cold_discovery_floor_limit_ms",
                       stall_limit="cold_discovery_stall_limit_ms")


def test_cold_discovery_after_runtime_start(host, measurements):
    truth = sorted(host.managed_truth())
    host.settled_inventory()
    from_process_start, runtime_reported, floors = [], [], []
    starts, floor_starts = [], []  # (start, end) on the node's clock, for the stalls inside each
    witness = host.stall_witness()  # started first: the node's stalls during every start and floor
    try:
        for _ in range(RESTARTS):
            old_pid = host.runtime_pid()
            host.restart_runtime()
            pid = host.runtime_pid()
            assert pid != old_pid, "restart_runtime left the old runtime process in place"
            started_ns = node_monotonic_ns_of_process_start(host, pid)
            runtime = host.runtime
            assert runtime.hello["pid"] == pid, (
                f"the runtime answering is pid {runtime.hello['pid']}, the one started is {pid}")
            mark = subscribe_from_start(runtime)
            done = runtime.wait_event("inventory_complete", mark, COLD_DISCOVERY_TIMEOUT_S,
                                      what="cold discovery after a runtime start")
            assert sorted(done["data"]["bdfs"]) == truth, (
                f"cold discovery reported {sorted(done['data']['bdfs'])}; the host has {truth}")
            assert done["data"]["devices"] == len(truth)
            announced = sorted(e["data"]["device"] for e in runtime.events(mark, "discovered")
                               if e["data"]["cause"] == "boot" and e["seq"] < done["seq"])
            assert announced == truth, (
                f"`discovered` (boot) before inventory_complete for {announced}; the host has {truth}")
            inventory = runtime.call("inventory")
            assert inventory["complete"] is True
            assert sorted(d["device"] for d in inventory["devices"]) == truth

            elapsed_ms = ms_between(started_ns, done["ts_ns"])
            reported_ms = float(done["data"]["duration_ms"])
            assert 0 <= reported_ms <= elapsed_ms + TICK_MS, (
                f"runtime reports {reported_ms:.0f} ms of cold discovery, but only {elapsed_ms:.0f} ms "
                f"passed since its process started")
            from_process_start.append(elapsed_ms)
            runtime_reported.append(reported_ms)
            starts.append((started_ns, done["ts_ns"]))
            floor_starts.append(bare_interpreter_start(host, pid))
            floors.append(ms_between(*floor_starts[-1]))
            assert runtime.violations == []
    finally:
        stalls = witness.stop()

    measurements.record("DISC-03", "cold_discovery_runtime_reported", runtime_reported, "ms")
    judge_over_floor(host, measurements, "DISC-03", "cold_discovery", from_process_start, floors,
                     BUDGETS, stat="max",
                     stalls=([stalled_ms(stalls, *span, acting=True) for span in starts],
                             [stalled_ms(stalls, *span, acting=True) for span in floor_starts]))
