"""Waiting for the stand-in's records, on the store's own condition, with a deadline."""

from __future__ import annotations

import time

from hilconform.emulators.kubelet_stand_in.records import RecordStore


def records_of(store: RecordStore, kind: str | None = None, resource: str | None = None) -> list[dict]:
    found = store.since(0, 100_000)[0]
    return [
        r
        for r in found
        if (kind is None or r["kind"] == kind) and (resource is None or r["resource"] == resource)
    ]


def wait_record(
    store: RecordStore,
    kind: str,
    resource: str | None = None,
    where=lambda record: True,
    timeout_s: float = 5.0,
) -> dict:
    """The first record of ``kind`` (for ``resource``) that ``where`` accepts; AssertionError
    naming what was awaited when none arrives within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = store.stats()["last_seq"]
        for record in records_of(store, kind, resource):
            if where(record):
                return record
        left = deadline - time.monotonic()
        if left <= 0:
            kinds = [(r["kind"], r["resource"]) for r in records_of(store)][-12:]
            raise AssertionError(
                f"no {kind} record for {resource or 'any resource'} within {timeout_s} s; "
                f"last records: {kinds}"
            )
        store.wait_past(last, left)
