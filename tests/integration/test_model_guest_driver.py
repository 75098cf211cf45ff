"""The guest driver a device model names (vfio-pci), bound in a real guest on QEMU 11.1 with an emulated
IOMMU: bound at boot and on hot-add, nouveau kept away, registers still readable through resource0,
and the kernel's AER recovery of a model, which it cannot do without a driver (shown by unbinding).
One VM of the first shipped profile with two cold-plugged A100 models and an empty slot for one."""

from __future__ import annotations

import time

import pytest
from model_vm import restoring_faults, running_vm

from hilconform.emulators import hotplug
from hilconform.emulators.profile import available_profiles, load_profile
from hilconform.emulators.vfio_user.guest_driver import bound_driver
from hilconform.emulators.vfio_user.hot_add import release_model

BIND_TIMEOUT_S = 10.0
MAGIC = 0x43494C48


def _a100_model_profile():
    for name in available_profiles():
        profile = load_profile(name)
        models = [s for s in profile.slots if s.populated and profile.kind(s.device).model == "a100-sxm4"]
        spare = [s for s in profile.slots if not s.populated and profile.kind(s.accepts).model == "a100-sxm4"]
        if len(models) >= 2 and spare:
            return profile, models[0].name, models[1].name, spare[0].name
    pytest.fail("no shipped profile with two A100 models and an empty slot for one")


PROFILE, GPU_A, GPU_B, SPARE = _a100_model_profile()


@pytest.fixture(scope="module")
def vm():
    yield from running_vm(PROFILE)  # start() itself checks the cold-plugged models are bound


@pytest.fixture
def faults(vm):
    yield from restoring_faults(vm)


def _bdf(faults, slot):
    return faults._resolve("check", slot).device.bdf


def _wait_bound(vm, bdf, driver="vfio-pci"):
    deadline = time.monotonic() + BIND_TIMEOUT_S
    while (have := bound_driver(vm, bdf)) != driver and time.monotonic() < deadline:
        time.sleep(0.1)  # the guest's udev rule binds it; bounded by the deadline
    assert have == driver, f"{bdf}: {driver} not bound within {BIND_TIMEOUT_S} s (bound: {have})"


def _recovery_events(vm, bdf):
    """ERROR_EVENT values of the udev change events the guest's monitor saw for `bdf`."""
    text = vm.agent.shell("cat /run/hilconform/aer-uevents.txt", timeout_s=20).stdout
    events, current = [], None
    for line in text.splitlines():
        if line.startswith("DEVPATH="):
            current = line.rsplit("/", 1)[-1]
        elif line.startswith("ERROR_EVENT=") and current == bdf:
            events.append(line.split("=", 1)[1])
    return events


def test_cold_plugged_models_have_vfio_pci_and_nouveau_stays_away(vm, faults):
    for slot in (GPU_A, GPU_B):
        assert bound_driver(vm, _bdf(faults, slot)) == "vfio-pci"
    lspci = vm.agent.run(["lspci", "-k", "-d", "10de:20b0"], timeout_s=20).stdout
    assert lspci.count("Kernel driver in use: vfio-pci") == 2, lspci
    assert "nouveau" not in vm.agent.shell("lsmod; dmesg | grep -i nouveau", timeout_s=20).stdout
    assert "DMAR: IOMMU enabled" in vm.guest_dmesg()


def test_registers_read_through_resource0_with_vfio_pci_bound(vm, faults):
    target = faults._resolve("check", GPU_A)
    registers = faults.model_registers("check", target, "magic", "firmware_version")
    assert registers["magic"] == MAGIC
    assert registers["firmware_version"] == 92 << 16 | 0 << 8 | 36


def test_nonfatal_error_is_recovered_by_the_kernel_and_not_without_the_driver(vm, faults):
    vm.agent.shell("udevadm monitor --kernel --property --subsystem-match=pci "
                   "> /run/hilconform/aer-uevents.txt 2>&1 &", timeout_s=20)
    time.sleep(0.5)  # the monitor subscribes; nothing to wait on from the host
    bdf = _bdf(faults, GPU_A)
    record = faults.aer_nonfatal(GPU_A, wait_recovery=True)
    assert record.details["recovery"] == "successful"
    deadline = time.monotonic() + BIND_TIMEOUT_S
    while len(_recovery_events(vm, bdf)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # udev's monitor writes the events; bounded by the deadline
    assert _recovery_events(vm, bdf) == ["BEGIN_RECOVERY", "SUCCESSFUL_RECOVERY"]
    # The control: without a driver the kernel gives up at once (no error_detected callback).
    vm.agent.shell(f"echo {bdf} > /sys/bus/pci/drivers/vfio-pci/unbind", timeout_s=20)
    try:
        assert faults.aer_nonfatal(GPU_A, wait_recovery=True).details["recovery"] == "failed"
        assert _recovery_events(vm, bdf)[-1] == "FAILED_RECOVERY"
    finally:
        vm.agent.shell(f"echo {bdf} > /sys/bus/pci/drivers_probe", timeout_s=20)
    _wait_bound(vm, bdf)


def test_hot_added_model_is_bound_readable_and_removable_twice(vm, faults):
    for _ in range(2):
        added = hotplug.hot_add(vm, SPARE)
        _wait_bound(vm, added.bdf)
        assert vm.agent.read_file(f"/sys/bus/pci/devices/{added.bdf}/enable").strip() == b"1"
        target = faults._resolve("check", SPARE)
        assert faults.model_registers("check", target, "magic")["magic"] == MAGIC
        removal = hotplug.remove(vm, added.device_id)
        assert removal.duration_s < hotplug.REMOVAL_TIMEOUT_S[vm.profile.hotplug_mode]
        release_model(vm, SPARE)
        listed = vm.agent.run(["lspci", "-D", "-n"], timeout_s=20).stdout
        assert added.bdf not in listed


def test_fatal_error_resets_the_link_and_the_kernel_reports_recovery(vm, faults):
    """Last: the secondary bus reset wipes the card's config and vfio-pci (with no user) restores
    nothing, as on a lab host; the runtime's reaction is AER-02's subject."""
    record = faults.aer_fatal(GPU_B, wait_recovery=True)
    assert record.details["recovery"] == "successful"
    port = record.details["port_bdf"]
    assert f"pcieport {port}: AER: Root Port link has been reset" in vm.guest_dmesg()
    assert bound_driver(vm, _bdf(faults, GPU_B)) == "vfio-pci"
