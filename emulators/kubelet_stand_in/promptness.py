"""Run the stand-in ahead of everything else on its node, so that when it heard a message is when
the plugin sent it.

Why: the stand-in is the harness's observer. DP-07 orders the plugin's ListAndWatch message of a
device's loss against the kernel's `remove` uevent of that device, both on the node's clock. On a
busy node (one vCPU shared with the runtime, and the kernel's hot-plug removal, which runs in a
SCHED_FIFO 50 interrupt thread), a normal-priority stand-in read a message the plugin had sent
135 ms before the removal only after the kernel's removal had run: a plugin that did everything
right was failed for the observer's lateness. Above the interrupt threads, the stand-in's threads
(the gRPC core's included: Linux threads inherit the policy of the thread that creates them) run
as soon as a plugin's bytes arrive. A real kubelet does not run so; the stand-in's receipt times
are the plugin's send times, which is what the clauses judge.

The stand-in only waits on sockets, so it never holds the CPU, and it starts no programs (they
would inherit the class: SCHED_RESET_ON_FORK cannot be used, as Linux applies it to new threads
too, and gRPC's would fall back to normal). Without the privilege (a lab host where the stand-in
is not root) the stand-in runs as it is and says so in its ready event.
"""

from __future__ import annotations

import os

ABOVE_INTERRUPT_THREADS = 60  # the kernel's threaded interrupts (pciehp's among them) run at FIFO 50


def run_promptly(priority: int) -> str:
    """Put this process (and every thread it starts from now on) in SCHED_FIFO at `priority`; what
    it runs under, in words, for the ready event. `priority` 0: leave it as it is."""
    if priority <= 0:
        return "normal (not asked for real-time)"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as exc:
        return f"normal (SCHED_FIFO {priority} refused: {exc})"
    return f"SCHED_FIFO {priority}"
