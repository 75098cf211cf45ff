"""Device models served over vfio-user, seen from a real guest (QEMU >= 10.1, Debian kernel).

One VM per module for the non-destructive checks (identity, registers, each
fault knob, FLR); each test restores the knob it turned. Server death, the
supervisor's removal and the reboot test get VMs of their own. Needs the
vfio-user QEMU (`make qemu-prefix`); without it the VM start raises ToolMissing,
an infrastructure error, never a pass.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from model_vm import own_vm, running_vm

from hilconform.emulators.hotplug import remove
from hilconform.emulators.profile import load_profile
from hilconform.emulators.toolchain import VFIO_USER_MIN_VERSION, vfio_user_qemu_binary
from hilconform.emulators.vfio_user import guest_bar
from hilconform.emulators.vfio_user.hot_add import hot_add_model, release_model
from hilconform.emulators.vfio_user.model import load_model
from hilconform.emulators.vfio_user.registers import register_map
from hilconform.emulators.vm import EmulatedVM

R = register_map()
GUEST_BAR = Path(guest_bar.__file__).read_bytes()
GPU0 = "0000:01:00.0"
GPU1 = "0000:02:00.0"


def bar(vm, bdf: str, *args: str) -> dict[int, int]:
    """Run guest_bar.py in the guest; {offset: value} for reads."""
    result = vm.agent.run(["python3", "-", bdf, *args], stdin=GUEST_BAR, timeout_s=60)
    assert result.exit_code == 0, result.stderr
    values = {}
    for line in result.stdout.split("\n"):
        if line.strip():
            off, value = line.split()
            values[int(off, 0)] = int(value, 0)
    return values


def read(vm, bdf: str, name: str) -> int:
    return bar(vm, bdf, "read", hex(R[name]))[R[name]]


def write(vm, bdf: str, name: str, value: int) -> None:
    bar(vm, bdf, "write", hex(R[name]), hex(value))


def shell(vm, script: str) -> str:
    result = vm.agent.shell(script, timeout_s=60)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def vm():
    yield from running_vm("a100")


@pytest.fixture
def gpu0(vm):
    vm.check_alive()
    device = vm.models.device("gpu0")
    yield device
    device.stick_queue(False)
    device.slow_queue(None)
    device.fall_off_bus(False)
    device.set_firmware_version(None)
    device.train_link()
    device.registers.queue.reset()


def test_the_vfio_user_qemu_is_used_and_recorded(vm):
    assert vm.qemu_binary == vfio_user_qemu_binary()
    version = tuple(int(x) for x in vm.qemu_version.split(".")[:2])
    assert version >= VFIO_USER_MIN_VERSION


def test_guest_lists_the_real_identity_and_link(vm):
    listing = shell(vm, "lspci -nn")
    assert listing.count("[10de:20b0]") == 2, listing
    detail = shell(vm, f"lspci -vv -s {GPU0}")
    assert "3D controller" in detail and "Subsystem: NVIDIA Corporation" in detail
    assert re.search(r"LnkCap:.*Speed 16GT/s, Width x16", detail), detail
    assert re.search(r"LnkSta:\s+Speed 16GT/s, Width x16", detail), detail
    assert "Device Serial Number" in detail and "Advanced Error Reporting" in detail
    assert "FLReset+" in detail
    sizes = re.findall(r"Region (\d): Memory at \w+ \((\d\d)-bit.*\[size=(\d+)M\]", detail)
    assert sizes == [("0", "32", "16"), ("1", "64", "256"), ("3", "64", "32")], detail
    serials = re.findall(r"Device Serial Number (\S+)", shell(vm, "lspci -vv -d 10de:20b0"))
    assert len(serials) == 2 and serials[0] != serials[1], serials  # two cards, two serial numbers


def test_registers_through_sysfs_resource0(vm, gpu0):
    values = bar(vm, GPU0, "read", hex(R["magic"]), hex(R["ident"]), hex(R["firmware_version"]))
    assert values[R["magic"]] == R["magic_value"]
    assert values[R["ident"]] == 0x10DE | 0x20B0 << 16
    assert values[R["firmware_version"]] == load_model("a100-sxm4").firmware.register
    write(vm, GPU0, "scratch", 0xC0FFEE)
    assert read(vm, GPU0, "scratch") == 0xC0FFEE == gpu0.registers.scratch


def test_queue_completes_and_stuck_queue_stops_completions(vm, gpu0):
    write(vm, GPU0, "queue_doorbell", 4)
    wait_until(lambda: read(vm, GPU0, "queue_in_flight") == 0, 10, "4 commands completed")
    gpu0.stick_queue()
    write(vm, GPU0, "queue_doorbell", 3)
    time.sleep(0.5)
    values = bar(vm, GPU0, "read", hex(R["queue_in_flight"]), hex(R["magic"]))
    assert values[R["queue_in_flight"]] == 3  # completions stopped ...
    assert values[R["magic"]] == R["magic_value"]  # ... while the registers answer
    gpu0.stick_queue(False)
    wait_until(lambda: read(vm, GPU0, "queue_in_flight") == 0, 10, "stuck commands completed after release")


def test_slow_queue(vm, gpu0):
    gpu0.slow_queue(1.5)
    # Timed from before the write: the model takes the doorbell (and starts the command's 1.5 s,
    # on this process's monotonic clock) before the guest agent's write returns, so a time taken
    # after it is late by the agent's round trip (1.35 s was seen under load).
    submitted = time.monotonic()
    write(vm, GPU0, "queue_doorbell", 1)
    assert read(vm, GPU0, "queue_in_flight") == 1
    wait_until(lambda: read(vm, GPU0, "queue_in_flight") == 0, 10, "slow command completed")
    assert time.monotonic() - submitted >= 1.5


def test_flr_from_the_guest_clears_the_queue(vm, gpu0):
    assert "flr" in shell(vm, f"cat /sys/bus/pci/devices/{GPU0}/reset_method")
    gpu0.stick_queue()
    write(vm, GPU0, "queue_doorbell", 5)
    assert read(vm, GPU0, "queue_in_flight") == 5
    flrs = gpu0.stats.flrs
    shell(vm, f"echo 1 > /sys/bus/pci/devices/{GPU0}/reset")
    assert gpu0.stats.flrs == flrs + 1
    assert read(vm, GPU0, "queue_in_flight") == 0
    assert read(vm, GPU0, "magic") == R["magic_value"]  # the kernel restored the config after FLR


def test_fell_off_the_bus_reads_all_ones_without_a_hotplug_event(vm, gpu0):
    mark = vm.qmp.mark()
    gpu0.fall_off_bus()
    assert shell(vm, f"setpci -s {GPU0} VENDOR_ID DEVICE_ID").split() == ["ffff", "ffff"]
    assert read(vm, GPU0, "magic") == 0xFFFFFFFF
    assert GPU0[5:] in shell(vm, "lspci")  # still listed: no removal happened
    assert not [e for e in vm.qmp.events(after=mark) if e["event"] == "DEVICE_DELETED"]
    gpu0.fall_off_bus(False)
    assert shell(vm, f"setpci -s {GPU0} VENDOR_ID").strip() == "10de"


def test_configuration_lost(vm, gpu0):
    assert int(shell(vm, f"setpci -s {GPU0} COMMAND").strip(), 16) & 0x2
    gpu0.lose_config()
    assert int(shell(vm, f"setpci -s {GPU0} COMMAND").strip(), 16) == 0
    assert read(vm, GPU0, "magic") == 0xFFFFFFFF  # BAR0 no longer decodes
    shell(vm, f"setpci -s {GPU0} COMMAND=0006")  # the guest restores it, as its driver would
    assert read(vm, GPU0, "magic") == R["magic_value"]


def test_firmware_version_mismatch(vm, gpu0):
    gpu0.set_firmware_version("91.2.3")
    assert read(vm, GPU0, "firmware_version") == 91 << 16 | 2 << 8 | 3
    gpu0.set_firmware_version(None)
    assert read(vm, GPU0, "firmware_version") == load_model("a100-sxm4").firmware.register


def test_link_trained_below_capability(vm, gpu0):
    gpu0.train_link("8", 8)
    detail = shell(vm, f"lspci -vv -s {GPU0}")
    assert re.search(r"LnkCap:.*Speed 16GT/s, Width x16", detail), detail
    assert re.search(r"LnkSta:\s+Speed 8GT/s \(downgraded\), Width x8 \(downgraded\)", detail), detail


def test_server_death_left_on_the_bus_then_removed_by_the_supervisor():
    with own_vm("a100") as vm:
        gpu1 = vm.models.server("gpu1")
        assert read(vm, GPU1, "magic") == R["magic_value"]
        died = time.monotonic()
        gpu1.die()
        incident = vm.models.supervisor.wait_incident("gpu1", timeout_s=5)
        assert (incident.kind, incident.action) == ("dead", "left")
        assert incident.noticed_s - died < 1.0
        # Left: fallen off the bus, as the guest sees it; QEMU itself raised no event.
        assert shell(vm, f"setpci -s {GPU1} VENDOR_ID").strip() == "ffff"
        assert read(vm, GPU1, "magic") == 0xFFFFFFFF
        assert read(vm, GPU0, "magic") == R["magic_value"]  # the other card is untouched
        # Policy "remove": the supervisor takes the next dead server off the bus through QMP.
        gpu0 = vm.models.server("gpu0")
        mark = vm.qmp.mark()
        vm.models.supervise("gpu0", "remove", vm.qmp)
        gpu0.die()
        incident = vm.models.supervisor.wait_incident("gpu0", timeout_s=5)
        assert (incident.kind, incident.action) == ("dead", "removed")
        vm.qmp.wait_event("DEVICE_DELETED", after=mark, timeout_s=20,
                          match=lambda data: data.get("device") == "gpu0", alive=vm.check_alive)
        assert GPU0[5:] not in shell(vm, "lspci")


def test_fpga_shell_survives_a_reboot_while_the_gpu_reinitialises():
    profile = load_profile("mixed")
    with EmulatedVM(profile, allow_reboot=True) as vm:
        fpga, gpu = "0000:01:00.0", "0000:02:00.0"
        assert "Processing accelerators [1200]: Xilinx Corporation Alveo U250 [10ee:5005]" in shell(
            vm, f"lspci -nn -s {fpga}")
        t4 = shell(vm, f"lspci -nn -vv -s {gpu}")
        assert "3D controller [0302]" in t4 and "[10de:1eb8]" in t4, t4
        assert re.search(r"LnkCap:.*Speed 8GT/s, Width x16", t4), t4
        shipped = load_model("alveo-u250").shell.register
        assert read(vm, fpga, "shell_version") == shipped
        write(vm, fpga, "shell_program", 0x00020200)
        write(vm, gpu, "scratch", 0x1234)
        vm.models.device("gpu0").stick_queue()
        write(vm, gpu, "queue_doorbell", 2)
        vm.reboot()
        assert read(vm, fpga, "shell_version") == 0x00020200  # the programmed shell stayed
        assert read(vm, gpu, "scratch") == 0  # the GPU re-initialised ...
        assert read(vm, gpu, "queue_in_flight") == 0  # ... and its queue was cleared
        assert vm.models.device("gpu0").stats.device_resets >= 2


def test_hung_server_noticed_and_removed_by_the_supervisor():
    with own_vm("a100") as vm:
        server = vm.models.server("gpu1")
        mark = vm.qmp.mark()
        vm.models.supervise("gpu1", "remove", vm.qmp)
        server.hang()
        # The guest's access stalls its vCPU for QEMU's message timeout, then reads all ones.
        assert read(vm, GPU1, "magic") == 0xFFFFFFFF
        incident = vm.models.supervisor.wait_incident("gpu1", timeout_s=10)
        assert (incident.kind, incident.action) == ("hung", "removed")
        # Noticed once a request went unanswered for hung_after_s (+ a poll), not at QEMU's timeout.
        assert incident.stalled_since_s is not None
        assert incident.noticed_s - incident.stalled_since_s < vm.models.supervisor.hung_after_s + 0.5
        server.resume()
        vm.qmp.wait_event("DEVICE_DELETED", after=mark, timeout_s=30,
                          match=lambda data: data.get("device") == "gpu1", alive=vm.check_alive)
        listing = shell(vm, "lspci -n")
        assert GPU1[5:] not in listing and GPU0[5:] in listing


def test_hot_add_a_model_into_an_empty_slot_then_remove_and_re_add(vm):
    added = hot_add_model(vm, "spare0")
    try:
        def listed():
            out = shell(vm, f"lspci -nn -s {added.bdf}")
            return "[10de:20b0]" in out and out
        wait_until(listed, 10, f"hot-added A100 model at {added.bdf} in the guest")
        detail = shell(vm, f"lspci -vv -s {added.bdf}")
        # The port reserved windows the model's BARs fit in: all three are assigned.
        assert len(re.findall(r"Region \d: Memory at [0-9a-f]+ ", detail)) == 3, detail
        assert read(vm, added.bdf, "magic") == R["magic_value"]
    finally:
        removal = remove(vm, added.device_id)
        release_model(vm, "spare0")
    assert removal.duration_s < 15
    assert added.bdf[5:] not in shell(vm, "lspci")
    again = hot_add_model(vm, "spare0")
    try:
        wait_until(lambda: "[10de:20b0]" in shell(vm, f"lspci -nn -s {again.bdf}"), 10, "re-added model")
    finally:
        remove(vm, again.device_id)
        release_model(vm, "spare0")
