"""The QEMU command line follows the profile (no QEMU started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hilconform.emulators.errors import InfrastructureError
from hilconform.emulators.image import GuestImage
from hilconform.emulators.layout import InstanceLayout
from hilconform.emulators.profile import load_profile
from hilconform.emulators.qemu_command import build_argv, nbd_blockdev, queue_node

IMAGE = GuestImage(Path("/img/vmlinux"), Path("/img/initramfs.cpio"), Path("/img/rootfs.ext4"), "6.1")
LAYOUT = InstanceLayout(Path("/tmp/hilc/x"))


def _devices(argv):
    return [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-device"]


def test_a100_argv_has_ports_devices_and_no_defaults():
    argv = build_argv("qemu", load_profile("a100-stock"), IMAGE, LAYOUT)
    assert "-nodefaults" in argv and "-S" in argv
    assert argv[argv.index("-accel") + 1] == "tcg"
    assert "ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off" in argv  # native pciehp
    devices = _devices(argv)
    ports = [d for d in devices if d["driver"] == "pcie-root-port"]
    assert [(p["chassis"], p["slot"]) for p in ports] == [(i, i) for i in range(1, 7)]
    assert {p["x-speed"] for p in ports} == {"16"}
    nvmes = [d for d in devices if d["driver"] == "nvme"]
    assert [n["bus"] for n in nvmes] == ["rp-gpu0", "rp-gpu1", "rp-gpu2", "rp-gpu3"]
    assert len({n["serial"] for n in nvmes}) == 4  # distinct identities
    blockdevs = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-blockdev"]
    assert [b["node-name"] for b in blockdevs] == [n["drive"] for n in nvmes]


def test_queue_devices_sit_on_a_throttle_raw_nbd_chain():
    argv = build_argv("qemu", load_profile("a100-stock"), IMAGE, LAYOUT)
    objects = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-object"]
    # one throttle group per slot (empty ones too, for hot-added queue devices), no limits
    assert objects == [{"qom-type": "throttle-group", "id": f"tg-{name}"}
                       for name in ("gpu0", "gpu1", "gpu2", "gpu3", "spare0", "spare1")]
    blockdevs = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-blockdev"]
    top = blockdevs[0]
    assert (top["driver"], top["node-name"], top["throttle-group"]) == ("throttle", "q-gpu0", "tg-gpu0")
    raw = top["file"]
    assert (raw["driver"], raw["node-name"]) == ("raw", "q-gpu0-raw")
    nbd = raw["file"]
    assert (nbd["driver"], nbd["node-name"], nbd["export"]) == ("nbd", "q-gpu0-nbd", "gpu0")
    assert nbd["server"] == {"type": "unix", "path": "/tmp/hilc/x/nbd-gpu0.sock"}


def test_hot_add_chain_matches_the_command_line():
    # hotplug.hot_add blockdev-adds nbd_blockdev(): the same chain a cold-plugged slot gets.
    argv = build_argv("qemu", load_profile("a100-stock"), IMAGE, LAYOUT)
    cold = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-blockdev"][1]
    assert cold == nbd_blockdev(LAYOUT, "gpu1")
    assert nbd_blockdev(LAYOUT, "spare0")["node-name"] == queue_node("spare0")


def test_acpi_mode_keeps_the_acpi_default():
    argv = build_argv("qemu", load_profile("a100-stock").with_hotplug_mode("acpi"), IMAGE, LAYOUT)
    assert not any("acpi-pci-hotplug" in a for a in argv)


def test_fpga_uses_edu_without_queues():
    devices = _devices(build_argv("qemu", load_profile("fpga-stock"), IMAGE, LAYOUT))
    assert [d["driver"] for d in devices if d.get("bus", "").startswith("rp-")] == ["edu", "edu"]


def test_unknown_accelerator_is_refused():
    with pytest.raises(InfrastructureError, match="unknown accelerator 'hvf'"):
        build_argv("qemu", load_profile("t4-stock"), IMAGE, LAYOUT, accel="hvf")


def test_root_ports_keep_a_device_number_each_up_to_fifteen_then_pack_as_functions():
    from hilconform.emulators.qemu_command import port_address

    assert [port_address(i, 15) for i in (0, 14)] == [("0x10", False), ("0x1e", False)]
    packed = [port_address(i, 16) for i in range(16)]
    assert packed[0] == ("0x10.0", True) and packed[7] == ("0x10.7", False) and packed[8] == ("0x11.0", True)
    assert port_address(119, 120) == ("0x1e.7", False)  # never 0x1f, the ICH9 LPC bridge


# -- switches and wide hosts (issue 14, topologies) -----------------------------------------------

def test_a_switch_is_a_root_port_an_upstream_port_and_a_downstream_port_per_slot():
    argv = build_argv("qemu", load_profile("switch-stock"), IMAGE, LAYOUT)
    devices = _devices(argv)
    roots = [d for d in devices if d["driver"] == "pcie-root-port"]
    # root ports: the slots not behind the switch (profile order), then the switch's own
    assert [(p["id"], p["addr"], p["chassis"], p["slot"]) for p in roots] == [
        ("rp-gpu2", "0x10", 1, 1), ("rp-gpu3", "0x11", 2, 2), ("rp-sw-sw0", "0x12", 10, 10)]
    assert roots[2]["x-speed"] == "16" and roots[2]["x-width"] == "16"  # the switch's link
    [upstream] = [d for d in devices if d["driver"] == "x3130-upstream"]
    assert upstream == {"driver": "x3130-upstream", "id": "up-sw0", "bus": "rp-sw-sw0", "addr": "0x0"}
    downstream = [d for d in devices if d["driver"] == "xio3130-downstream"]
    assert downstream == [
        {"driver": "xio3130-downstream", "id": f"rp-{name}", "bus": "up-sw0", "addr": f"0x{i:x}",
         "chassis": 11 + i, "slot": 11 + i}
        for i, name in enumerate(("gpu0", "gpu1", "spare0", "spare1"))]  # no x-speed/x-width there
    nvmes = [d for d in devices if d["driver"] == "nvme"]
    assert sorted((n["id"], n["bus"]) for n in nvmes) == [
        ("gpu0", "rp-gpu0"), ("gpu1", "rp-gpu1"), ("gpu2", "rp-gpu2"), ("gpu3", "rp-gpu3")]
    objects = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-object"]
    assert sorted(o["id"] for o in objects) == [f"tg-{s}" for s in ("gpu0", "gpu1", "gpu2", "gpu3",
                                                                    "spare0", "spare1")]
    # every bus a device names exists before it on the command line
    known = {"pcie.0", "vser.0"}
    for device in devices:
        assert device.get("bus", "pcie.0") in known, device
        known.add(device.get("id", ""))


def test_a_device_hot_added_behind_a_switch_goes_on_its_downstream_port():
    from hilconform.emulators.qemu_command import stand_in_device

    profile = load_profile("switch-stock")
    props = stand_in_device(profile.slot("spare0"), profile.kind("nvme"), "spare0-nvme")
    assert (props["bus"], props["addr"]) == ("rp-spare0", "0")


def test_a_wide_host_packs_its_twenty_root_ports_as_functions():
    devices = _devices(build_argv("qemu", load_profile("wide-stock"), IMAGE, LAYOUT))
    roots = [d for d in devices if d["driver"] == "pcie-root-port"]
    assert len(roots) == 20
    assert [r["addr"] for r in roots[:9]] == [f"0x10.{f}" for f in range(8)] + ["0x11.0"]
    assert roots[-1]["addr"] == "0x12.3"
    assert [r["addr"] for r in roots if r.get("multifunction")] == ["0x10.0", "0x11.0", "0x12.0"]


def test_a_switch_counts_as_one_root_port_when_packing(tmp_path):
    # 15 slots on root ports fit one device number each; the switch's root port makes 16: packed.
    head = '[host]\nname = "t"\n[budgets]\nguest_ready_s = 90\n'
    switch = '[[switches]]\nname = "s"\nchassis = 99\nslot = 99\nlink = { speed = "8", width = "16" }\n'
    slots = "".join(
        f'[[slots]]\nname = "r{i}"\nchassis = {i + 1}\nslot = {i + 1}\n'
        + ('switch = "s"\n' if i == 15 else 'link = { speed = "16", width = "16" }\n')
        + 'device = "empty"\naccepts = "nvme"\n'
        'stands_in_for = { vendor = "10de", device = "20b0", model = "A100" }\n'
        for i in range(16))
    path = tmp_path / "t.toml"
    path.write_text(head + switch + slots)
    devices = _devices(build_argv("qemu", load_profile(path), IMAGE, LAYOUT))
    roots = [d for d in devices if d["driver"] == "pcie-root-port"]
    assert [r["id"] for r in roots][-1] == "rp-sw-s" and len(roots) == 16
    assert roots[-1]["addr"] == "0x11.7" and roots[0]["addr"] == "0x10.0"
