"""Mutant drain_one_look, breaks HP-02: the drain looks at the queue once and reports it drained.

Plausible bug: a drain written as a single check rather than a wait, on the belief that isolation
already stopped the device's work and the look only proves the device still answers: it reads
the in-flight count once (one `queue_depth` probe: a device model's in-flight register, an nvme's
block-layer inflight) and reports `ok` with depth 0 at once, whatever it read. A read still in
flight is then cut off by the power-off. Unlike skip_drain it does look (polls 1), so it is
caught only where the test knows the read was in flight when the drain looked: a device model's
own record of the command it held (HP-02 on emulated:a100), the NBD backend let go only after the
drain reported (emulated:a100-stock).
"""

from __future__ import annotations

import time

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    original = procedures.drain

    def drain_with_one_look(hooks, sysfs, bdf, timeout_s, poll_s, gone) -> dict:
        start = time.monotonic()
        try:
            hooks.queue_depth(sysfs, bdf)  # the one look; its value is not waited on
        except OSError:  # unreadable (fell off the bus) or the runtime short of its own resources
            return original(hooks, sysfs, bdf, timeout_s, poll_s, gone)
        return {"status": "ok", "depth": 0, "polls": 1,
                "elapsed_ms": round((time.monotonic() - start) * 1000, 3)}

    procedures.drain = drain_with_one_look


if __name__ == "__main__":
    launch("drain_one_look", apply)
