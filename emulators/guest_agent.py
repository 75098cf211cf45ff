"""A small client for qemu-guest-agent: run commands and read files in the guest.

The agent speaks QMP-style JSON over a virtio-serial port whose host end is a
unix socket. It has no greeting, so a session starts with
`guest-sync-delimited` (the reply is preceded by 0xFF, which lets us skip any
stale bytes from an earlier session). Every call has a deadline.

Why the channel can never go out of step: the agent answers every request, in
order, even one whose caller gave up. A call that timed out (a 16 MB write
under TCG), a reconnect or a line of garbage leaves replies on the way that
belong to nobody; the next call used to read them as its own ("guest-get-time:
Invalid parameter 'pid'"). So after any such trouble the client is *out of
step*, and the next call first resynchronises: `guest-sync-delimited` with a
fresh token, everything before the 0xFF delimiter and every reply that is not
the token's discarded. Every request also carries its own `id`, which the agent
echoes, and a reply with another `id` is never taken for this one's.
"""

from __future__ import annotations

import base64
import json
import random
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import GuestAgentError, WaitTimeout
from .waiting import poll_until


@dataclass(frozen=True)
class GuestResult:
    """What a command run in the guest returned."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    def check(self) -> GuestResult:
        if self.exit_code != 0:
            raise GuestAgentError(
                f"guest command {' '.join(self.argv)} exited {self.exit_code}: {self.stderr.strip()}"
            )
        return self


WRITE_FILE_MAX_BYTES = 1 << 20  # write_file's limit: larger files go through the VM's share
SYNC_TIMEOUT_S = 5.0  # a resync before a call: the agent may still be busy with the abandoned one


class GuestAgent:
    def __init__(self, socket_path: Path):
        self.socket_path = socket_path
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self._in_step = False  # no reply owed to nobody is on its way (set by a sync, cleared by trouble)
        self._next_id = 0
        self.resyncs = 0  # how often a call had to resynchronise first (a diagnostic)

    # -- session --------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float, alive=None) -> float:
        """Sync with the agent, retrying until it answers; return seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s

        def answers() -> bool:
            if alive is not None:
                alive()
            try:
                self.sync(timeout_s=min(1.0, max(0.1, deadline - time.monotonic())))
                return True
            except (GuestAgentError, OSError) as exc:
                self.close()
                tried.append(exc)
                return False

        tried: list[Exception] = []
        poll_until(answers, timeout_s, "the guest agent's answer to a sync", every_s=0.05,
                   shown=lambda _: repr(tried[-1]) if tried else "no try")
        return time.monotonic() - started

    def sync(self, timeout_s: float = 2.0) -> None:
        with self._lock:
            self._connect()
            self._sync(time.monotonic() + timeout_s)

    def _sync(self, deadline: float) -> None:
        """Bring the channel into step: a fresh token, everything before its delimited reply
        dropped (stale replies of abandoned calls included)."""
        self._in_step = False
        token = random.randint(1, 2**31)
        self._send({"execute": "guest-sync-delimited", "arguments": {"id": token}})
        while True:
            reply = self._read_message(deadline, after_delimiter=True)
            if reply.get("return") == token:
                self._in_step = True
                return

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._buffer = b""
        self._in_step = False

    # -- commands -------------------------------------------------------------------------------
    def call(self, command: str, arguments: dict | None = None, timeout_s: float = 10.0) -> Any:
        with self._lock:
            self._connect()
            if not self._in_step:
                self.resyncs += 1
                self._sync(time.monotonic() + max(SYNC_TIMEOUT_S, timeout_s))
            self._next_id += 1
            request_id = f"hc-{self._next_id}"
            message: dict[str, Any] = {"execute": command, "id": request_id}
            if arguments:
                message["arguments"] = arguments
            self._in_step = False  # until its own reply is read: a timeout leaves it on the way
            self._send(message)
            deadline = time.monotonic() + timeout_s
            while True:
                reply = self._read_message(deadline)
                if reply.get("id", request_id) == request_id:  # an agent that echoes no id: in order
                    break
            self._in_step = True
        if "error" in reply:
            err = reply["error"]
            raise GuestAgentError(f"guest agent {command}: {err.get('class')}: {err.get('desc')}")
        return reply.get("return")

    def run(self, argv: list[str], timeout_s: float = 30.0, stdin: bytes | None = None) -> GuestResult:
        """Run a program in the guest and wait for it (deadline timeout_s)."""
        args: dict[str, Any] = {"path": argv[0], "arg": argv[1:], "capture-output": True}
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        pid = self.call("guest-exec", args)["pid"]
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            status = self.call("guest-exec-status", {"pid": pid})
            if status.get("exited"):
                break
            if time.monotonic() > deadline:
                raise WaitTimeout(f"guest command {' '.join(argv)} still running after {timeout_s}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        return GuestResult(
            argv=tuple(argv),
            exit_code=status.get("exitcode", -1 if "signal" in status else 0),
            stdout=_decode(status.get("out-data")),
            stderr=_decode(status.get("err-data")),
        )

    def shell(self, script: str, timeout_s: float = 30.0) -> GuestResult:
        return self.run(["/bin/sh", "-c", script], timeout_s=timeout_s)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write `data` to `path` in the guest (folders made as needed) with permissions `mode`.

        For small files only (configuration, scripts): the bytes travel base64-encoded in one
        `guest-exec` message, which the agent parses whole; a 22 MB plugin never arrived. A large
        file goes through the VM's share (EmulatedVM.share_file_in_guest)."""
        if len(data) > WRITE_FILE_MAX_BYTES:
            raise ValueError(f"{path}: {len(data)} bytes is too large for the guest agent (at most "
                             f"{WRITE_FILE_MAX_BYTES}): put it in the VM's share")
        result = self.run(["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"',
                           "sh", path, f"{mode:o}"], stdin=data)
        if result.exit_code != 0:
            raise GuestAgentError(f"could not write {path} in the guest: exit {result.exit_code} "
                                      f"{result.stderr.strip()}")

    def read_file(self, path: str, limit: int = 4 << 20) -> bytes:
        handle = self.call("guest-file-open", {"path": path, "mode": "r"})
        try:
            chunks = []
            total = 0
            while total < limit:
                part = self.call("guest-file-read", {"handle": handle, "count": 65536})
                data = base64.b64decode(part.get("buf-b64", ""))
                chunks.append(data)
                total += len(data)
                if part.get("eof") or not data:
                    break
            return b"".join(chunks)
        finally:
            self.call("guest-file-close", {"handle": handle})

    # -- wire -----------------------------------------------------------------------------------
    def _connect(self) -> None:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(self.socket_path))
            self._sock = sock
            self._buffer = b""

    def _send(self, message: dict) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            self.close()
            raise GuestAgentError(f"guest agent: could not send {message.get('execute')}: {exc}") from exc

    def _read_message(self, deadline: float, after_delimiter: bool = False) -> dict:
        assert self._sock is not None
        if after_delimiter:
            while b"\xff" not in self._buffer:
                self._fill(deadline)
            self._buffer = self._buffer.split(b"\xff")[-1]
        while True:
            line, sep, rest = self._buffer.partition(b"\n")
            if sep:
                self._buffer = rest
                line = line.strip()
                if not line:
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    self._in_step = False  # garbage: whatever follows may be out of step too
                    continue
                if isinstance(message, dict):
                    return message
                self._in_step = False
            self._fill(deadline)

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.close()
            raise GuestAgentError("guest agent: no reply before the deadline")
        self._sock.settimeout(remaining)
        try:
            data = self._sock.recv(65536)
        except TimeoutError:
            self.close()
            raise GuestAgentError("guest agent: no reply before the deadline") from None
        if not data:
            self.close()
            raise GuestAgentError("guest agent: connection closed")
        self._buffer += data


def _decode(b64: str | None) -> str:
    return base64.b64decode(b64).decode(errors="replace") if b64 else ""
