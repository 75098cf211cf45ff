"""Per-class hooks for hilconform device models: registers read through a fake sysfs resource0."""

from __future__ import annotations

import struct
import tomllib
from pathlib import Path

import pytest
from fakesysfs import ConfigBuilder, FakeSysfs, mem_bar

from hilconform.runtime import procedures
from hilconform.runtime.device_classes import (
    MODEL_REGISTERS_PATH,
    DeviceUnreachable,
    ModelHooks,
    NvidiaGpuHooks,
    hooks_for,
    load_model_registers,
)
from hilconform.runtime.inventory import describe

GPU = "0000:02:00.0"
REGS = load_model_registers()
EMULATOR_REGISTERS = Path(__file__).resolve().parents[3] / "emulators" / "models" / "registers.toml"


def test_runtime_register_copy_matches_the_emulators():
    """The runtime may not import emulators/: its copy of the offsets must not drift."""
    with open(EMULATOR_REGISTERS, "rb") as fh:
        emulators = tomllib.load(fh)
    with open(MODEL_REGISTERS_PATH, "rb") as fh:
        runtime = tomllib.load(fh)
    assert runtime == emulators


def _bar0(in_flight=0, firmware=(1, 2, 3), magic=REGS["magic_value"]) -> bytearray:
    data = bytearray(4096)
    for name, value in (
        ("magic", magic),
        ("ident", 0x10DE | 0x20B0 << 16),
        ("firmware_version", firmware[0] << 16 | firmware[1] << 8 | firmware[2]),
        ("queue_in_flight", in_flight),
    ):
        struct.pack_into("<I", data, REGS[name], value)
    return data


@pytest.fixture
def fake(tmp_path):
    return FakeSysfs(tmp_path)


def _model(fake, bar0: bytes, enable: str = "1"):
    config = ConfigBuilder(vendor=0x10DE, device=0x20B0, class_code=0x030200).build()
    dev = fake.add_device(
        GPU, config, resource=[mem_bar(0xFD000000, 0x1000000, mem64=False)], mmio={0: bytes(bar0)}
    )
    (dev / "enable").write_text(enable + "\n")
    return describe(fake.sysfs, GPU), dev


def _poke(dev: Path, name: str, value: int) -> None:
    data = bytearray((dev / "resource0").read_bytes())
    struct.pack_into("<I", data, REGS[name], value)
    (dev / "resource0").write_bytes(bytes(data))


def test_model_ids_select_model_hooks_before_class_hooks(fake):
    info, _ = _model(fake, _bar0())
    hooks = hooks_for(info, {"models": ["10de:20b0"], "firmware": {"10de:20b0": "9.9.9"}})
    assert isinstance(hooks, ModelHooks) and hooks.name == "model"
    assert not hooks.requires_driver
    assert isinstance(hooks_for(info), NvidiaGpuHooks)  # not listed: a real GPU's hooks


def test_queue_probe_reads_the_in_flight_counter(fake):
    info, dev = _model(fake, _bar0(in_flight=3))
    hooks = hooks_for(info, {"models": ["10de:20b0"]})
    assert hooks.queue_depth(fake.sysfs, GPU) == 3
    _poke(dev, "queue_in_flight", 0)
    assert hooks.queue_depth(fake.sysfs, GPU) == 0


def test_firmware_reads_the_version_register_not_an_override(fake):
    info, dev = _model(fake, _bar0(firmware=(535, 104, 5)))
    hooks = hooks_for(info, {"models": ["10de:20b0"], "firmware": {"10de:20b0": "1.0"}})
    assert hooks.firmware_version(fake.sysfs, GPU, info) == "535.104.5"
    _poke(dev, "firmware_version", 2 << 16 | 1 << 8 | 0)
    assert hooks.firmware_version(fake.sysfs, GPU, info) == "2.1.0"


def test_all_ones_means_fell_off_the_bus(fake):
    info, dev = _model(fake, b"\xff" * 4096)
    hooks = hooks_for(info, {"models": ["10de:20b0"]})
    with pytest.raises(DeviceUnreachable, match="all ones"):
        hooks.queue_depth(fake.sysfs, GPU)
    assert hooks.firmware_version(fake.sysfs, GPU, info) is None


def test_wrong_magic_is_not_read_as_a_queue(fake):
    info, _ = _model(fake, _bar0(in_flight=2, magic=0x12345678))
    with pytest.raises(DeviceUnreachable, match="magic"):
        hooks_for(info, {"models": ["10de:20b0"]}).queue_depth(fake.sysfs, GPU)


def test_memory_decoding_is_enabled_first_when_no_driver_did(fake):
    info, dev = _model(fake, _bar0(in_flight=1), enable="0")
    assert hooks_for(info, {"models": ["10de:20b0"]}).queue_depth(fake.sysfs, GPU) == 1
    assert (dev / "enable").read_text().strip() == "1"


def test_unreadable_resource_is_an_error_not_no_probe(fake):
    info, dev = _model(fake, _bar0())
    (dev / "resource0").unlink()
    with pytest.raises(OSError, match="unreadable"):
        hooks_for(info, {"models": ["10de:20b0"]}).queue_depth(fake.sysfs, GPU)


def test_drain_on_a_fallen_off_model_is_unreadable_not_a_timeout(fake):
    info, _ = _model(fake, b"\xff" * 4096)
    hooks = hooks_for(info, {"models": ["10de:20b0"]})
    result = procedures.drain(hooks, fake.sysfs, GPU, timeout_s=1.0, poll_s=0.01, gone=lambda: False)
    assert result["status"] == "unreadable" and "all ones" in result["error"]
    assert result["elapsed_ms"] < 1000


def test_drain_waits_for_the_model_queue(fake):
    info, dev = _model(fake, _bar0(in_flight=2))
    hooks = hooks_for(info, {"models": ["10de:20b0"]})
    result = procedures.drain(hooks, fake.sysfs, GPU, timeout_s=0.05, poll_s=0.01, gone=lambda: False)
    assert result["status"] == "timeout" and result["depth"] == 2
    _poke(dev, "queue_in_flight", 0)
    result = procedures.drain(hooks, fake.sysfs, GPU, timeout_s=0.05, poll_s=0.01, gone=lambda: False)
    assert result["status"] == "ok"
