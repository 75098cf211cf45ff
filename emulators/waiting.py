"""The one way the harness polls: a probe called until it gives something, by a deadline.

    device = poll_until(lambda: find_block_device(bdf), 10, f"a block device under {bdf}")

Every wait has a deadline, and the error at the deadline says what was awaited, for how long,
and the last thing the probe saw, so a timeout in a report reads as a finding about the test bed
(`WaitTimeout` is an InfrastructureError) rather than a bare "timed out". Waits on events (QMP
events, the runtime's) block on their queue instead (qmp_session.py, event_log.py); this is for
what can only be looked at.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from .errors import WaitTimeout

T = TypeVar("T")


def poll_until(probe: Callable[[], T], timeout_s: float, awaited: str, *, every_s: float = 0.05,
               check: Callable[[], None] | None = None, error: Callable[[str], Exception] = WaitTimeout,
               shown: Callable[[object], str] = repr) -> T:
    """`probe()` until it returns something truthy, which is returned; `check()` runs between
    tries and raises to give up early (a child process that died). At the deadline, `error`
    (WaitTimeout unless the caller's family is another) with a message naming `awaited`."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = probe()
        if seen:
            return seen
        if check is not None:
            check()
        left = deadline - time.monotonic()
        if left <= 0:
            raise error(f"{awaited}: not within {timeout_s:g} s (last seen: {shown(seen)})")
        time.sleep(min(every_s, left))
