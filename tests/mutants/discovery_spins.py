"""Mutant discovery_spins, breaks DISC-03: the runtime keeps the node's CPU busy from its start.

Plausible bug: the hot-plug watcher busy-polls (a non-blocking read of its source in a loop with
no sleep, here SPINNERS threads) from the runtime's start on, so the runtime's cold discovery
competes with it for the interpreter (its every sysfs read waits for the lock the spinners hold)
and for the node's CPU.

What it exploits: a floor measured beside the runtime while it runs. The bare interpreter that
times the test bed's floor then competes with the spinning runtime for the node's one virtual
CPU, so the floor grows with the runtime's hunger and the share (cold discovery less floor)
hides it, or the floor goes over its limit and the clause is excused as inconclusive. DISC-03 now
holds the runtime stopped while it measures the floor.
"""

from __future__ import annotations

import threading

from .launch import launch

SPINNERS = 3


def _spin() -> None:
    polls = 0
    while True:  # the busy poll: never sleeps, never blocks
        polls += 1


def apply() -> None:
    for number in range(SPINNERS):
        threading.Thread(target=_spin, name=f"hotplug-poll-{number}", daemon=True).start()


if __name__ == "__main__":
    launch("discovery_spins", apply)
