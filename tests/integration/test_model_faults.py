"""The FaultInjector on a model host: each model knob through the injector, verified in the guest,
undone by restore_all(); a stock-only fault refused on a model slot. One VM (a100)."""

from __future__ import annotations

import time

import pytest
from model_vm import restoring_faults, running_vm

from hilconform.emulators.errors import FaultError


@pytest.fixture(scope="module")
def vm():
    yield from running_vm("a100")


@pytest.fixture
def faults(vm):
    yield from restoring_faults(vm)


def test_stall_is_verified_in_the_guest_and_resumes(vm, faults):
    stall = faults.stall_queue("gpu0")
    assert stall.record.details["in_flight"] > 0
    registers = faults.model_registers("check", faults._resolve("check", "gpu0"),
                                       "queue_in_flight", "queue_head")
    time.sleep(0.3)
    again = faults.model_registers("check", faults._resolve("check", "gpu0"), "queue_head")
    assert again["queue_head"] == registers["queue_head"], "a stuck queue completed work"
    resumed = faults.resume_queue("gpu0")
    assert resumed.details["in_flight"] == 0


def test_stall_resumes_on_its_timer_without_qemu_freezing(vm, faults):
    stall = faults.stall_queue("gpu1", resume_after_s=0.5)
    vm.qmp.execute("query-status")  # QMP answers while the model is stuck
    stall.wait_resumed(5.0)
    assert not vm.models.device("gpu1").queue.stuck


def test_slow_queue_then_restore(vm, faults):
    record = faults.slow_queue("gpu0", iops=1)
    assert record.details["in_flight_after_submit"] > 0 or record.details["checked_after_s"] >= 2.0
    faults.restore_queue_speed("gpu0")
    assert vm.models.device("gpu0").queue.service_s == pytest.approx(200e-6)


def test_fell_off_bus_reads_all_ones_and_comes_back(vm, faults):
    record = faults.fall_off_bus("gpu1")
    assert record.details["magic"] == "0xffffffff"
    faults.restore_all()
    target = faults._resolve("check", "gpu1")
    assert faults.model_registers("check", target, "magic")["magic"] == 0x43494C48


def test_firmware_mismatch_and_link_degraded_are_seen_by_the_guest(vm, faults):
    faults.mismatch_firmware("gpu0", "1.2.3")
    target = faults._resolve("check", "gpu0")
    assert faults.model_registers("check", target, "firmware_version")["firmware_version"] == 0x010203
    link = faults.degrade_link("gpu0", "8", 8)
    assert "Width x8" in link.details["lnksta"]
    faults.restore_all()
    assert faults.model_registers("check", target, "firmware_version")["firmware_version"] != 0x010203


def _guest_reset_s(vm, bdf: str) -> float:
    """Seconds a sysfs reset of `bdf` takes in the guest (the kernel waits for the card to be ready)."""
    started = time.monotonic()
    result = vm.agent.run(["sh", "-c", f"echo 1 > /sys/bus/pci/devices/{bdf}/reset"], timeout_s=90)
    assert result.exit_code == 0, f"guest reset of {bdf} failed: {result.stderr}"
    return time.monotonic() - started


def test_reset_not_ready_makes_the_guests_reset_wait_then_lifts(vm, faults):
    bdf = faults._resolve("check", "gpu1").device.bdf
    faults.delay_reset_ready("gpu1", 2.0)
    waited = _guest_reset_s(vm, bdf)
    log = vm.agent.run(["dmesg"], timeout_s=30).stdout
    assert waited >= 2.0, f"the guest's reset returned after {waited:.2f} s, before the card was ready"
    assert f"{bdf[5:]}: not ready" in log and "after FLR; waiting" in log, log[-800:]
    faults.restore_all()
    assert _guest_reset_s(vm, bdf) < 1.5, "the reset still waits after the knob was lifted"
    target = faults._resolve("check", "gpu1")
    assert faults.model_registers("check", target, "magic")["magic"] == 0x43494C48


def test_stock_only_faults_are_refused_on_a_model_slot(vm, faults):
    with pytest.raises(FaultError, match="io-errors at gpu0"):
        faults.inject_io_errors("gpu0")
    faults.require("fell-off-bus", "gpu0")
