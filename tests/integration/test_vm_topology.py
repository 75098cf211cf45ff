"""Hosts beyond the shipped shapes: a host of 16 slots (more root ports than q35 has device numbers
for, so they are packed as functions) boots and takes a hot-add in its last slot, and a QEMU that
exits before QMP answers is reported with QEMU's own last words, not a bare EOFError."""

from __future__ import annotations

import time

import pytest

from hilconform.emulators import vm as vm_module
from hilconform.emulators.errors import InfrastructureError
from hilconform.emulators.hotplug import hot_add
from hilconform.emulators.pci_inventory import query_pci
from hilconform.emulators.profile import load_profile
from hilconform.emulators.vm import EmulatedVM

SLOTS = 16
NVME = "1b36:0010"


def _wide_profile(folder, slots: int = SLOTS) -> str:
    """A stock-device profile of `slots` root ports: one nvme, the rest empty slots accepting one."""
    head = """[host]
name = "wide-test"
hotplug_mode = "acpi"
[runtime]
select_ids = ["1b36:0010"]
[budgets]
guest_ready_s = 90
"""
    body = "".join(
        f"""
[[slots]]
name = "s{i}"
chassis = {i + 1}
slot = {i + 1}
link = {{ speed = "16", width = "16" }}
device = "{"nvme" if i == 0 else "empty"}"
accepts = "nvme"
stands_in_for = {{ vendor = "10de", device = "20b0", model = "NVIDIA A100 SXM4 40GB" }}
"""
        for i in range(slots)
    )
    path = folder / "wide-test.toml"
    path.write_text(head + body)
    return str(path)


def _guest_count(vm, ids: str) -> int:
    out = vm.agent.run(["lspci", "-n", "-d", ids]).stdout
    return len([line for line in out.splitlines() if line.strip()])


def test_a_host_of_sixteen_slots_boots_and_hot_adds_into_its_last_slot(tmp_path):
    vm = EmulatedVM(load_profile(_wide_profile(tmp_path))).start()
    try:
        ports = [f for f in query_pci(vm.qmp) if f.qdev_id.startswith("rp-")]
        assert len(ports) == SLOTS, [p.qdev_id for p in ports]
        assert _guest_count(vm, NVME) == 1
        hot_add(vm, f"s{SLOTS - 1}")
        deadline = time.monotonic() + 20
        while _guest_count(vm, NVME) < 2:
            assert time.monotonic() < deadline, "the nvme hot-added into slot 16 never showed in the guest"
            time.sleep(0.2)
    finally:
        vm.stop()


def test_too_many_slots_is_a_profile_error(tmp_path):
    with pytest.raises(InfrastructureError, match="at most 120 root ports"):
        load_profile(_wide_profile(tmp_path, slots=121))


def test_qemu_that_exits_before_qmp_answers_is_reported_with_its_own_words(tmp_path, monkeypatch):
    """QEMU makes its QMP socket, then refuses a device and exits: the error is QEMU's line."""
    real_build_argv = vm_module.build_argv

    def with_a_device_qemu_refuses(*args, **kwargs):
        return [*real_build_argv(*args, **kwargs), "-device", '{"driver":"no-such-device"}']

    monkeypatch.setattr(vm_module, "build_argv", with_a_device_qemu_refuses)
    vm = EmulatedVM(load_profile("a100-stock"))
    with pytest.raises(InfrastructureError) as info:
        vm.start(30)
    assert "no-such-device" in str(info.value), str(info.value)
    assert "EOFError" not in str(info.value)
    assert vm.qemu is not None and not vm.qemu.alive()
