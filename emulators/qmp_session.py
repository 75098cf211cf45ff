"""One QMP session per VM, usable from plain (non-async) code.

qemu.qmp's QMPClient is asyncio-only and has no timeouts; QEMU sends events
only to the connected client. So a VM holds exactly one client for its whole
life, on an event loop in a private thread. Every command has a deadline,
every event is kept in memory (with a sequence number, for race-free waits)
and appended to a JSONL file for the reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qemu.qmp import EventListener, ExecuteError, QMPClient

from .errors import QmpError, WaitTimeout
from .event_log import EventLog

DEFAULT_TIMEOUT_S = 10.0
CONNECT_RETRY_S = 0.02  # pause between connects refused while QEMU has bound but not yet listens


def _refused(exc: QmpError) -> bool:
    """Whether a failed connect was refused (the socket exists, nobody listens on it yet)."""
    cause = exc.__cause__
    return isinstance(getattr(cause, "exc", cause), ConnectionRefusedError)


class QmpSession:
    def __init__(self, socket_path: Path, event_log: Path, name: str = "hilconform"):
        self.socket_path = socket_path
        self.event_log = event_log
        self._client = QMPClient(name)
        self._listener = EventListener()
        self._client.register_listener(self._listener)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="qmp", daemon=True)
        self._events = EventLog()
        self._log = open(event_log, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._pump: asyncio.Task | None = None
        self._closed = False

    # -- connection ---------------------------------------------------------------------------
    def connect(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Connect within timeout_s. QEMU binds its socket (the path appears) before it listens:
        a connect in between is refused, so a refusal is retried until the deadline."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                left_s = max(deadline - time.monotonic(), 0.1)
                try:
                    self._run(self._client.connect(str(self.socket_path)), left_s, "connect")
                    break
                except QmpError as exc:
                    if not _refused(exc) or time.monotonic() + CONNECT_RETRY_S >= deadline:
                        raise
                time.sleep(CONNECT_RETRY_S)
        except QmpError:
            self.close()
            raise
        self._pump = self._run(self._start_pump(), 5.0, "start event pump")

    def close(self) -> None:
        """Disconnect and stop the thread. Errors from a dead QEMU are expected and dropped."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                self._run(self._client.disconnect(), 5.0, "disconnect")
            except (QmpError, EOFError, OSError):
                pass
            if self._pump is not None:
                try:
                    self._run(self._stop_pump(), 5.0, "disconnect")
                except QmpError:
                    pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._log.close()

    # -- commands -----------------------------------------------------------------------------
    def execute(self, command: str, arguments: dict | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
        """Run a QMP command; raise QmpError naming the command on error or timeout."""
        return self._run(self._client.execute(command, arguments), timeout_s, command)

    def hmp(self, command_line: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """Run an HMP command. HMP reports errors as text: the caller checks the text."""
        return self.execute("human-monitor-command", {"command-line": command_line}, timeout_s)

    def _run(self, coro, timeout_s: float, what: str) -> Any:
        if self._closed and what != "disconnect":
            coro.close()
            raise QmpError(f"QMP {what}: session is closed")
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout_s), self._loop)
        try:
            return future.result(timeout_s + 1.0)
        except ExecuteError as exc:
            raise QmpError(f"QMP {what} failed: {exc.error_class}: {exc}") from None
        except TimeoutError:
            future.cancel()
            raise QmpError(f"QMP {what}: no reply within {timeout_s:.1f}s") from None
        except Exception as exc:  # ConnectError, EOFError, ExecInterruptedError, ...
            raise QmpError(f"QMP {what} failed: {type(exc).__name__}: {exc}") from exc

    # -- events -------------------------------------------------------------------------------
    async def _start_pump(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self._pump_events())

    async def _stop_pump(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump

    async def _pump_events(self) -> None:
        async for message in self._listener:
            event = {
                "seq": len(self._events) + 1,
                "host_ns": time.monotonic_ns(),
                "event": message["event"],
                "data": message.get("data", {}),
                "timestamp": message.get("timestamp"),
            }
            self._log.write(json.dumps(event) + "\n")
            self._log.flush()
            self._events.append(event)

    def mark(self) -> int:
        """Position of the newest event; wait_event(after=mark) sees only later ones."""
        return self._events.mark()

    def events(self, after: int = 0) -> list[dict[str, Any]]:
        return self._events.since(after)

    def wait_event(self, name: str, after: int, timeout_s: float,
                   match: Callable[[dict[str, Any]], bool] | None = None,
                   alive: Callable[[], None] | None = None) -> dict[str, Any]:
        """Wait for event `name` after `after` (and `match(data)`), or raise WaitTimeout.

        `alive` is called while waiting; it raises if the VM died, so a dead QEMU
        is reported as such rather than as a timeout.
        """
        return self._events.wait_for(
            name, after, timeout_s, match, alive=alive,
            on_timeout=lambda: WaitTimeout(f"QMP event {name} did not arrive within {timeout_s:.1f}s"),
        )
