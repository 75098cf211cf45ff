"""An append-only log of events that threads can wait on, race-free.

Callers take `mark()` before they act, then `wait_for(name, after=mark, ...)`:
an event that arrives between the action and the wait is still seen. Used
for QMP events and for a runtime's protocol events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Event = dict[str, Any]


class EventLog:
    def __init__(self) -> None:
        self._events: list[Event] = []
        self._cond = threading.Condition()

    def append(self, event: Event) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._events)

    def mark(self) -> int:
        """Position of the newest event; a wait `after=mark` sees only later ones."""
        return len(self)

    def since(self, after: int = 0) -> list[Event]:
        with self._cond:
            return list(self._events[after:])

    def wait_for(self, name: str, after: int, timeout_s: float,
                 match: Callable[[dict], bool] | None,
                 on_timeout: Callable[[], Exception],
                 alive: Callable[[], None] | None = None) -> Event:
        """The first event `name` after `after` whose data satisfies `match`.

        Raises `on_timeout()` at the deadline; `alive` is called while waiting
        and may raise (e.g. QEMU died), so a dead peer is not reported as a timeout.
        """
        deadline = time.monotonic() + timeout_s
        seen = after
        with self._cond:
            while True:
                for event in self._events[seen:]:
                    if event["event"] == name and (match is None or match(event["data"])):
                        return event
                seen = len(self._events)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise on_timeout()
                self._cond.wait(min(remaining, 0.25))
                if alive is not None:
                    alive()
