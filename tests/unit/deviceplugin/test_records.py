"""The record store stays bounded whatever a plugin sends, and counts what it gave up."""

from __future__ import annotations

import json
import threading

from hilconform.emulators.kubelet_stand_in.records import OVERFLOW, RecordStore


def test_records_are_numbered_and_read_back_since_a_seq():
    store = RecordStore()
    first = store.add("register_request", "example.com/gpu", {"version": "v1beta1"})
    store.add("list_and_watch", "example.com/gpu", {"devices": []}, ts_ns=5, capacity=0)
    records, more = store.since(0, 10)
    assert [r["seq"] for r in records] == [1, 2] and not more
    assert records[0] == first
    assert records[1]["ts_ns"] == 5 and records[1]["capacity"] == 0
    assert store.since(1, 10)[0] == records[1:]
    assert store.since(0, 1) == (records[:1], True)


def test_a_flooding_stream_keeps_its_last_records_and_leaves_the_others_alone():
    store = RecordStore(per_stream=10)
    store.add("register_accepted", "r")
    for i in range(1000):
        store.add("list_and_watch", "r", {"i": i})
    records, _ = store.since(0, 100)
    assert records[0]["kind"] == "register_accepted"
    assert [r["message"]["i"] for r in records[1:]] == list(range(990, 1000))
    assert store.dropped() == [{"resource": "r", "kind": "list_and_watch", "dropped": 990}]


def test_total_bytes_are_bounded_and_the_fattest_stream_gives_way():
    store = RecordStore(per_stream=1000, max_bytes=20_000)
    store.add("options", "quiet", {"x": 1})
    for _ in range(200):
        store.add("list_and_watch", "loud", {"blob": "x" * 500})
    stats = store.stats()
    assert stats["bytes"] <= 20_000
    assert store.since(0, 1)[0][0]["kind"] == "options"
    assert store.dropped()[0]["resource"] == "loud"


def test_streams_past_the_limit_share_one_overflow_stream():
    store = RecordStore(per_stream=5, max_streams=3)
    for i in range(100):
        store.add("register_refused", f"bad{i}.example/x", reason="r")
    assert store.stats()["kept"] <= 3 * 5
    kinds = {(d["resource"], d["kind"]) for d in store.dropped()}
    assert kinds == {OVERFLOW}


def test_wait_past_returns_when_a_record_arrives_or_the_deadline_passes():
    store = RecordStore()
    assert not store.wait_past(0, 0.01)
    threading.Timer(0.01, store.add, args=("kubelet_start",)).start()
    assert store.wait_past(0, 5.0)


def test_an_enormous_resource_name_is_cut_in_the_record():
    store = RecordStore()
    record = store.add("register_refused", "x" * 100_000, reason="r")
    assert len(record["resource"]) < 600 and record["resource"].endswith("(+99488 characters)")


def test_the_journal_holds_every_record_as_a_line_then_says_where_it_stopped(tmp_path):
    path = tmp_path / "journal.jsonl"
    store = RecordStore(per_stream=2, journal=str(path), journal_max_bytes=400)
    for i in range(10):
        store.add("list_and_watch", "example.com/gpu", {"devices": [], "n": i})
    store.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    *records, last = lines
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert len(records) > 2, "the journal keeps what the store's per-stream bound gives up"
    assert last == {"journal_full": True, "last_seq": len(records)}
    assert path.stat().st_size <= 400 + len(json.dumps(last)) + 1
