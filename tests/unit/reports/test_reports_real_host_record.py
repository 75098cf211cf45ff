"""The run record of a real host (--host real:...): its kernel, sysfs ground truth, the runtime's hello,
inventory and events, without touching `host.vm` (a real host has none). A stand-in runtime
client and survey play the lab machine here."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hilconform.fixtures.real_host import RealHost
from hilconform.fixtures.run_record import HostRecorder

INVENTORY = {
    "complete": True,
    "generation": 1,
    "devices": [
        {"device": "0000:3b:00.0", "state": "HEALTHY", "info": {"vendor_id": "10de", "device_id": "20b0"}}
    ],
}


class StandInClient:
    hello = {
        "runtime": "vendor-runtime",
        "runtime_version": "2.3",
        "protocol": 1,
        "versions": [1],
        "config": {},
    }

    def call(self, method, params=None, timeout_s=10.0):
        assert method == "inventory"
        return INVENTORY

    def events(self, after=0, name=None):
        return [{"event": "inventory_complete", "seq": 1, "data": {"devices": 1}, "host_ns": 5}][after:]


def test_a_real_host_is_recorded_without_touching_its_vm(tmp_path):
    host = RealHost(
        runner=None,
        profile_name=None,
        allow_destructive=False,
        journal_path=tmp_path / "journal.jsonl",
        name="ssh://lab@gpu7:22",
    )
    host.initial = {"kernel": "6.1.0-31-amd64"}
    host.survey = lambda: {
        "devices": {"0000:3b:00.0": {"vendor": "0x10de", "device": "0x20b0", "class": "0x030200"}}
    }
    host._runtime = StandInClient()
    recorder = HostRecorder(tmp_path / "run", "gw3")
    item = SimpleNamespace(funcargs={"host": host}, nodeid="suites/real/test_real01_link.py::test_link")
    recorder.record(item)
    recorder.record(item)  # a second test: nothing written twice
    assert not (tmp_path / "run" / "record-errors.jsonl").exists()
    record = json.loads((tmp_path / "run" / "hosts" / "real-ssh_lab_gpu7_22.json").read_text())
    assert record["guest_kernel"] == "6.1.0-31-amd64" and record["qemu_version"] is None
    assert record["worker"] == "gw3"
    assert [f["ids"] for f in record["ground_truth"]] == ["10de:20b0"]
    assert record["runtime"]["runtime"] == "vendor-runtime" and record["inventory"] == INVENTORY
    events = (tmp_path / "run" / "events" / "real-ssh_lab_gpu7_22.jsonl").read_text().splitlines()
    assert [json.loads(e)["event"] for e in events] == ["inventory_complete"]
