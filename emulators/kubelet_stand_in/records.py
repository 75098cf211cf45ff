"""Everything the stand-in saw, as numbered, time-stamped records, in bounded memory.

A record is a dict: ``seq`` (1, 2, … across all records), ``ts_ns`` (the node's
``time.monotonic_ns()`` when the message arrived or the call was made), ``kind``
(control.RECORD_KINDS), ``resource`` (empty for the kubelet's own records), ``message``
(the decoded message as plain JSON, or None) and the kind's extra fields (``reason``, …).

Why bounded, and how: a plugin that floods ListAndWatch must not grow the stand-in without
limit, nor push out the records of its registration. So records are kept per stream, a
stream being one (resource, kind): at most ``per_stream`` records each, the oldest going
first; at most ``max_bytes`` of record JSON in all, the stream that holds the most giving
up its oldest first; at most ``max_streams`` streams, records of further ones sharing one
overflow stream. Every record given up is counted, per stream, and ``dropped()`` says so.
Records are stored as their JSON text: compact, and its length is what the bound counts.

The journal (optional): every record also appended, as one JSON line, to a file a reader on the
node can follow with `tail` alone, where asking the control socket costs an interpreter start
(about 1 s under TCG). It is bounded too: past ``journal_max_bytes`` one last line
``{"journal_full": true, "last_seq": N}`` says that records after N are only in the store.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import threading
import time
from collections import deque

OVERFLOW = ("*", "*")  # the stream of records past max_streams
MAX_RESOURCE_CHARS = 512  # a longer resource name is cut in records (RegisterRequest keeps it whole)


class _Stream:
    def __init__(self):
        self.records: deque[tuple[int, str]] = deque()
        self.bytes = 0
        self.dropped = 0

    def drop_oldest(self) -> int:
        _, text = self.records.popleft()
        self.bytes -= len(text)
        self.dropped += 1
        return len(text)


class RecordStore:
    def __init__(self, per_stream: int = 1000, max_bytes: int = 64 << 20, max_streams: int = 256,
                 journal: str | None = None, journal_max_bytes: int = 64 << 20):
        self.per_stream = per_stream
        self.max_bytes = max_bytes
        self.max_streams = max_streams
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._bytes = 0
        self._seq = itertools.count(1)
        self._last_seq = 0
        self._lock = threading.Lock()
        self._grown = threading.Condition(self._lock)
        self._journal_fd = None if journal is None else os.open(
            journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._journal_left = journal_max_bytes

    def add(
        self, kind: str, resource: str = "", message: dict | None = None, ts_ns: int | None = None, **extra
    ) -> dict:
        """Store one record and return it; ``extra`` must be plain JSON."""
        if len(resource) > MAX_RESOURCE_CHARS:
            resource = f"{resource[:MAX_RESOURCE_CHARS]}…(+{len(resource) - MAX_RESOURCE_CHARS} characters)"
        record = {
            "seq": 0,
            "ts_ns": time.monotonic_ns() if ts_ns is None else ts_ns,
            "kind": kind,
            "resource": resource,
            "message": message,
            **extra,
        }
        with self._lock:
            record["seq"] = self._last_seq = next(self._seq)
            text = json.dumps(record, separators=(",", ":"), ensure_ascii=True)
            stream = self._stream(resource, kind)
            stream.records.append((record["seq"], text))
            stream.bytes += len(text)
            self._bytes += len(text)
            while len(stream.records) > self.per_stream:
                self._bytes -= stream.drop_oldest()
            while self._bytes > self.max_bytes:
                fattest = max(self._streams.values(), key=lambda s: s.bytes)
                self._bytes -= fattest.drop_oldest()
            self._journal_line(text, record["seq"])
            self._grown.notify_all()
        return record

    def _journal_line(self, text: str, seq: int) -> None:
        """Append one record to the journal (lock held); past its bound, the closing line."""
        if self._journal_fd is None:
            return
        line = (text + "\n").encode()
        if len(line) > self._journal_left:
            line = (json.dumps({"journal_full": True, "last_seq": seq - 1}) + "\n").encode()
            os.write(self._journal_fd, line)
            os.close(self._journal_fd)
            self._journal_fd = None
            return
        os.write(self._journal_fd, line)
        self._journal_left -= len(line)

    def close(self) -> None:
        with self._lock:
            if self._journal_fd is not None:
                os.close(self._journal_fd)
                self._journal_fd = None

    def wait_past(self, seq: int, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until a record numbered above ``seq`` exists; whether one does."""
        with self._grown:
            return self._grown.wait_for(lambda: self._last_seq > seq, timeout_s)

    def _stream(self, resource: str, kind: str) -> _Stream:
        key = (resource, kind)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= self.max_streams:
                key = OVERFLOW
                stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = _Stream()
        return stream

    def since(self, seq: int, limit: int) -> tuple[list[dict], bool]:
        """Records with a ``seq`` above ``seq``, oldest first, at most ``limit``; and whether
        more are kept past them."""
        with self._lock:
            lists = [[r for r in s.records if r[0] > seq] for s in self._streams.values()]
        merged = list(itertools.islice(heapq.merge(*lists), limit + 1))
        return [json.loads(text) for _, text in merged[:limit]], len(merged) > limit

    def dropped(self) -> list[dict]:
        """Per stream with losses: how many of its records were given up."""
        with self._lock:
            return [
                {"resource": resource, "kind": kind, "dropped": s.dropped}
                for (resource, kind), s in sorted(self._streams.items())
                if s.dropped
            ]

    def stats(self) -> dict:
        with self._lock:
            kept = sum(len(s.records) for s in self._streams.values())
            return {
                "last_seq": self._last_seq,
                "kept": kept,
                "bytes": self._bytes,
                "dropped": sum(s.dropped for s in self._streams.values()),
            }
