"""Follows the kernel log (/dev/kmsg) for pciehp and AER lines.

Why: an attention-button removal is announced only in the kernel log
("Slot(N): Powering off due to button press"), 5 s before pciehp removes the
device; the runtime must start its orderly removal then. AER lines name the
source device at once, before counters are polled.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("hilconform.runtime")
_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_PREFIX = rf"^(?:\S+ )?(?P<port>{_BDF}): (?:pciehp: )?"
_SLOT = r"Slot\((?P<slot>[^)]+)\):?"

_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("attention_button", re.compile(_PREFIX + _SLOT + r" Attention button pressed")),
    ("button_power_off", re.compile(_PREFIX + _SLOT + r" Powering off due to button press")),
    ("button_power_on", re.compile(_PREFIX + _SLOT + r" Powering on due to button press")),
    (
        "button_cancel",
        re.compile(_PREFIX + _SLOT + r" (?:Button cancel|Action canceled due to button press)"),
    ),
    ("link_down", re.compile(_PREFIX + _SLOT + r" (?:Link Down|Card not present)")),
    (
        "aer_error",
        re.compile(
            rf"^(?:\S+ )?(?P<port>{_BDF}): AER: (?P<multi>Multiple )?"
            r"(?P<severity>Corrected|Correctable|Uncorrected \(Non-Fatal\)"
            r"|Uncorrectable \(Non-Fatal\)|Uncorrected \(Fatal\)|Uncorrectable \(Fatal\))"
            r" error (?:message )?received(?: from)?:? "
            rf"(?P<bdf>{_BDF})"
        ),
    ),
    ("aer_recovered", re.compile(rf"^(?:\S+ )?(?P<port>{_BDF}): AER: device recovery successful")),
    (
        "aer_recovery_failed",
        re.compile(rf"^(?:\S+ )?(?P<port>{_BDF}): AER: device recovery failed"),
    ),
    (
        "link_reset",
        re.compile(rf"^(?:\S+ )?(?P<port>{_BDF}): (?:AER: )?Root Port link has been reset"),
    ),
]


@dataclass(frozen=True)
class KernelEvent:
    kind: str
    line: str
    port: str | None = None  # the device that printed the line (the hot-plug port for pciehp)
    slot: str | None = None
    bdf: str | None = None  # AER: the error source
    severity: str | None = None  # AER: correctable | nonfatal | fatal
    kmsg_ts_us: int | None = None
    received_ns: int | None = None  # time.monotonic_ns() when the runtime read the line

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _severity(text: str) -> str:
    if text.startswith("Correct"):
        return "correctable"
    return "fatal" if "(Fatal)" in text else "nonfatal"


def parse_record(record: str) -> KernelEvent | None:
    """One kmsg record ("PRI,SEQ,TS,FLAGS;text", continuation lines ignored) or plain line."""
    first = record.split("\n", 1)[0]
    ts_us = None
    head, sep, text = first.partition(";")
    if sep and re.fullmatch(r"\d+,\d+,\d+,[^;]*", head):
        try:
            ts_us = int(head.split(",")[2])
        except ValueError:
            ts_us = None
    else:
        text = first
    text = re.sub(r"^\[\s*\d+\.\d+\]\s*", "", text.strip())  # dmesg-style timestamp
    for kind, pattern in _PATTERNS:
        m = pattern.search(text)
        if m:
            groups = m.groupdict()
            return KernelEvent(
                kind=kind,
                line=text,
                port=(groups.get("port") or "").lower() or None,
                slot=groups.get("slot"),
                bdf=(groups.get("bdf") or "").lower() or None,
                severity=_severity(groups["severity"]) if groups.get("severity") else None,
                kmsg_ts_us=ts_us,
                received_ns=time.monotonic_ns(),
            )
    return None


class KernelLogFollower:
    """A thread reading new kernel log records and passing matches to ``on_event``.

    Reads /dev/kmsg from its end (history is not replayed). A regular file is
    followed like ``tail -f`` (used by tests and for replaying a saved log).
    """

    def __init__(self, path: str, on_event: Callable[[KernelEvent], None], from_start: bool = False):
        self.path = path
        self.on_event = on_event
        self.from_start = from_start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        # stop() writes here: the follower waits in select for records or a stop, with no
        # timeout turns (a 0.2 s turn cost an idle TCG guest ~1% of its CPU, issue 17)
        self._wake_r: int | None = None
        self._wake_w: int | None = None

    def start(self) -> bool:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            if not self.from_start:
                os.lseek(self._fd, 0, os.SEEK_END)
            self._wake_r, self._wake_w = os.pipe()
        except OSError as exc:
            log.warning(f"kernel log {self.path} not followed: {exc}")
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            return False
        self._thread = threading.Thread(target=self._run, name="kernel-log", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._wake_w is not None:
            os.write(self._wake_w, b"x")
        if self._thread:
            self._thread.join(timeout=2)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in (self._wake_r, self._wake_w):
            if fd is not None:
                os.close(fd)
        self._wake_r = self._wake_w = None

    def _run(self) -> None:
        regular = not self.path.startswith("/dev/")
        pending = b""
        while not self._stop.is_set():
            if not regular:
                try:
                    select.select([self._fd, self._wake_r], [], [])
                except (OSError, ValueError):
                    return
                if self._stop.is_set():
                    return
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                log.warning(f"kernel log read failed: {exc}")
                return
            if not chunk:
                self._stop.wait(0.05)
                continue
            pending += chunk
            *records, pending = pending.split(b"\n")
            for raw in records:
                if not raw or raw[:1] == b" ":  # kmsg continuation lines (SUBSYSTEM=..)
                    continue
                event = parse_record(raw.decode("utf-8", "replace"))
                if event:
                    try:
                        self.on_event(event)
                    except Exception as exc:  # never let a handler kill the follower
                        log.warning(f"kernel log handler failed: {exc!r}")
