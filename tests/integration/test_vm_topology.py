"""Hosts beyond the shipped shapes: a host of 16 slots (more root ports than q35 has device numbers
for, so they are packed as functions) boots and takes a hot-add in its last slot, and a QEMU that
exits before QMP answers is reported with QEMU's own last words, not a bare EOFError.

The shipped topologies (issue 14): `wide-stock` (20 root ports packed as functions) takes a native
hot-add into each of its 16 empty slots; `switch-stock` shows its switch in QEMU and in the guest,
takes a hot-add behind a downstream port, and recovers from a fatal error injected there. One VM at
a time: the switch tests share one, torn down after its class."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from hilconform.emulators import vm as vm_module
from hilconform.emulators.errors import BadInput, InfrastructureError
from hilconform.emulators.faults import FaultInjector
from hilconform.emulators.hotplug import hot_add
from hilconform.emulators.pci_inventory import function_below, guest_lspci, query_pci
from hilconform.emulators.profile import load_profile
from hilconform.emulators.vm import EmulatedVM
from hilconform.emulators.workload import block_device
from hilconform.fixtures.guest_kernel_log import kernel_recovery_window

SLOTS = 16
NVME = "1b36:0010"
XIO3130_UPSTREAM, XIO3130_DOWNSTREAM = "104c:8232", "104c:8233"
SWITCH_SLOTS = ("gpu0", "gpu1", "spare0", "spare1")  # switch-stock's sw0, in port order


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
    with pytest.raises(BadInput, match="at most 120 root ports"):
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


def _wait_guest_count(vm, ids: str, count: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while _guest_count(vm, ids) < count:
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s"
        time.sleep(0.2)


def test_wide_stock_boots_and_takes_a_native_hot_add_in_each_empty_slot():
    vm = EmulatedVM(load_profile("wide-stock")).start()
    try:
        assert vm.profile.hotplug_mode == "native"
        ports = [f for f in query_pci(vm.qmp) if f.qdev_id.startswith("rp-")]
        assert len(ports) == 20 and {p.bdf[:10] for p in ports} == {"0000:00:10", "0000:00:11", "0000:00:12"}
        assert _guest_count(vm, NVME) == 4
        for i in range(16):
            hot_add(vm, f"spare{i}")
        _wait_guest_count(vm, NVME, 20, 30, "the guest never listed all 20 nvme after 16 native hot-adds")
    finally:
        vm.stop()


@pytest.fixture(scope="class")
def switch_vm():
    """One switch-stock VM for the tests of a class, stopped after them (one VM at a time)."""
    vm = EmulatedVM(load_profile("switch-stock")).start()
    yield vm
    vm.stop()


class TestSwitchStock:
    def test_qemu_and_the_guest_show_the_switch_and_the_devices_behind_it(self, switch_vm):
        functions = query_pci(switch_vm.qmp)
        by_id = {f.qdev_id: f for f in functions if f.qdev_id}
        root, upstream = by_id["rp-sw-sw0"], by_id["up-sw0"]
        assert root.bdf.startswith("0000:00:")
        assert (upstream.bdf, upstream.ids) == (f"0000:{root.secondary_bus:02x}:00.0", XIO3130_UPSTREAM)
        downstream = [by_id[f"rp-{name}"] for name in SWITCH_SLOTS]
        assert [(d.bdf, d.ids) for d in downstream] == [
            (f"0000:{upstream.secondary_bus:02x}:{i:02x}.0", XIO3130_DOWNSTREAM) for i in range(4)]
        for name in ("gpu0", "gpu1", "gpu2", "gpu3"):
            assert (by_id[name].bdf, by_id[name].ids) == (function_below(functions, f"rp-{name}"), NVME)
        occupied = {f.bdf for f in functions}
        assert function_below(functions, "rp-spare0") not in occupied
        assert [f.key() for f in guest_lspci(switch_vm.agent)] == [f.key() for f in functions]

    def test_a_native_hot_add_into_an_empty_downstream_slot_reaches_the_guest(self, switch_vm):
        added = hot_add(switch_vm, "spare0")
        assert added.bdf == function_below(query_pci(switch_vm.qmp), "rp-spare0")
        # pciehp waits 1 s for the link here: QEMU's xio3130-downstream lacks Link Active Reporting
        assert block_device(switch_vm.agent, added.bdf, timeout_s=20).startswith("/dev/nvme")

    def test_a_fatal_error_at_a_downstream_port_is_recovered_by_the_guest_kernel(self, switch_vm):
        functions = {f.qdev_id: f for f in query_pci(switch_vm.qmp) if f.qdev_id}
        record = FaultInjector(switch_vm).aer_fatal("gpu0", wait_recovery=True)
        port = functions["rp-gpu0"].bdf
        assert record.device_id == "rp-gpu0"
        root_port = functions["rp-sw-sw0"].bdf  # counts the error; the recovery runs at the port
        assert (record.details["port_bdf"], record.details["root_port_bdf"]) == (port, root_port)
        assert record.details["recovery"] == "successful"
        dmesg = switch_vm.agent.run(["dmesg"]).check().stdout
        assert f"pcieport {port}: AER: Downstream Port link has been reset" in dmesg
        window = kernel_recovery_window(SimpleNamespace(run=switch_vm.agent.run), port)
        assert window is not None and window[2] == "successful", window
        device = block_device(switch_vm.agent, functions["gpu0"].bdf)  # and it still reads
        switch_vm.agent.run(["dd", f"if={device}", "of=/dev/null", "bs=4096", "count=1"],
                            timeout_s=20).check()
