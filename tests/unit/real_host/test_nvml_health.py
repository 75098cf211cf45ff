"""REAL-02 mapping and the NVML probe, with recorded NVML replies (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hilconform.fixtures import nvml_probe
from hilconform.fixtures.nvml_health import health_from_nvml, runtime_not_better

DATA = Path(__file__).resolve().parent.parent.parent / "data" / "nvml"


def recorded(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.mark.parametrize("name, state, reason", [
    ("healthy_a100", "HEALTHY", None),                     # XIDs 13/31 are application faults
    ("fallen_off_bus", "FAULTED", "XID 79"),
    ("remap_pending", "DEGRADED", "row remap is pending"),
    ("t4_retired_pages", "FAULTED", "62 retired pages"),
    ("remap_failure", "FAULTED", "row remapping failed"),
])
def test_recorded_replies_map_onto_runtime_states(name, state, reason):
    got, reasons = health_from_nvml(recorded(name))
    assert got == state, reasons
    if reason is None:
        assert reasons == []
    else:
        assert any(reason in r for r in reasons), reasons


def test_the_worse_signal_wins():
    gpu = recorded("remap_pending")
    gpu["xid_events"].append({"xid": 48, "source": "kernel"})
    assert health_from_nvml(gpu)[0] == "FAULTED"


@pytest.mark.parametrize("runtime, nvml, ok", [
    ("HEALTHY", "HEALTHY", True), ("DEGRADED", "HEALTHY", True), ("HEALTHY", "DEGRADED", False),
    ("DEGRADED", "FAULTED", False), ("FAULTED", "FAULTED", True), ("ALLOCATED", "DEGRADED", False),
    ("REMOVED", "FAULTED", True),
])
def test_runtime_may_be_worse_than_nvml_never_better(runtime, nvml, ok):
    assert runtime_not_better(runtime, nvml) is ok


ROW_FIELDS = ("correctable", "uncorrectable", "pending", "failure")


class NotSupported(Exception):
    """pynvml raises NVMLError_NotSupported; the probe knows it by name."""


NotSupported.__name__ = "NVMLError_NotSupported"


class Timeout(Exception):
    pass


Timeout.__name__ = "NVMLError_Timeout"


def fake_pynvml(gpus: list[dict], events: list[tuple[int, int]]):
    """A pynvml stand-in answering from recorded replies (per GPU index)."""
    handles = [SimpleNamespace(index=i) for i in range(len(gpus))]
    pending = list(events)

    def unsupported_or(value):
        if value is None:
            raise NotSupported("Not Supported")
        return value

    def ecc(h, kind, counter):
        rec = gpus[h.index]["ecc"]
        if rec is None:
            raise NotSupported("Not Supported")
        key = ("volatile" if counter == 0 else "aggregate") + ("_uncorrected" if kind == 1 else "_corrected")
        return rec[key]

    def wait(_set, _ms):
        if not pending:
            raise Timeout("Timeout")
        index, xid = pending.pop(0)
        return SimpleNamespace(device=handles[index], eventData=xid)

    return SimpleNamespace(
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_VOLATILE_ECC=0, NVML_AGGREGATE_ECC=1,
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
        nvmlEventTypeXidCriticalError=8,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=gpus[h.index]["nvml_bus_id"].encode()),
        nvmlDeviceGetName=lambda h: gpus[h.index]["name"].encode(),
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRetiredPages=lambda h, cause: unsupported_or(
            None if gpus[h.index]["retired_pages"] is None else
            [0x1000] * gpus[h.index]["retired_pages"]["double_bit" if cause == 1 else "single_bit"]),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: unsupported_or(
            None if gpus[h.index]["retired_pages"] is None
            else int(gpus[h.index]["retired_pages"]["pending"])),
        nvmlDeviceGetRemappedRows=lambda h: unsupported_or(
            None if gpus[h.index]["remapped_rows"] is None else tuple(
                gpus[h.index]["remapped_rows"][k] for k in ROW_FIELDS)),
        nvmlEventSetCreate=lambda: object(), nvmlEventSetFree=lambda s: None,
        nvmlDeviceRegisterEvents=lambda h, kinds, s: None,
        nvmlEventSetWait=wait,
    )


def test_probe_turns_nvml_replies_into_the_records_the_mapping_reads():
    t4, a100 = recorded("t4_retired_pages"), recorded("remap_pending")
    t4["nvml_bus_id"], a100["nvml_bus_id"] = "00000000:3B:00.0", "00000000:B1:00.0"
    kernel_log = ["6,1234,5678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"]
    report = nvml_probe.collect(fake_pynvml([t4, a100], [(1, 63), (1, 94)]), kernel_log, window_ms=1)
    by_bus = {g["bus_id"]: g for g in report["gpus"]}
    assert set(by_bus) == {"0000:3b:00.0", "0000:b1:00.0"}
    assert report["driver"] == "550.54.15"
    assert by_bus["0000:3b:00.0"]["ecc"]["aggregate_uncorrected"] == 40
    assert by_bus["0000:3b:00.0"]["retired_pages"] == {"double_bit": 40, "single_bit": 22, "pending": False}
    assert by_bus["0000:3b:00.0"]["remapped_rows"] is None
    assert by_bus["0000:3b:00.0"]["xid_events"] == [{"xid": 79, "source": "kernel"}]
    assert by_bus["0000:b1:00.0"]["xid_events"] == [{"xid": 63, "source": "nvml"},
                                                    {"xid": 94, "source": "nvml"}]
    assert health_from_nvml(by_bus["0000:3b:00.0"])[0] == "FAULTED"
    assert health_from_nvml(by_bus["0000:b1:00.0"])[0] == "DEGRADED"
