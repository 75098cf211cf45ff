"""Sysfs access, device descriptions, fingerprints and the identity registry (DISC-01, DISC-05)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fakesysfs import FakeSysfs, edu_config, io_bar, mem_bar, nvme_config, root_port_config

from hilconform.runtime.inventory import (
    DeviceGone,
    IdentityRegistry,
    describe,
    fingerprint,
    unique_fingerprints,
)

DUMPS = Path(__file__).resolve().parents[2] / "data" / "pci-config"
NVME = "0000:01:00.0"
PORT = "0000:00:10.0"


@pytest.fixture
def fake(tmp_path):
    f = FakeSysfs(tmp_path)
    f.add_device(PORT, root_port_config(slot_number=1), driver="pcieport", aer=True)
    f.add_device(
        NVME,
        (DUMPS / "qemu72-seabios-nvme-1b36-0010.bin").read_bytes(),
        parent=PORT,
        driver="nvme",
        slot="1",
        resource=[mem_bar(0xFE000000, 0x4000)],
        nvme_inflight=(0, 0),
        nvme_serial="SN-A",
        nvme_firmware="1.0",
        reset_method="flr bus",
        numa_node=0,
        msi_irqs=(24, 25),
    )
    return f


# --- Sysfs ------------------------------------------------------------------------------
def test_sysfs_attributes(fake):
    s = fake.sysfs
    assert s.pci_addresses() == [PORT, NVME]
    assert s.exists(NVME) and not s.exists("0000:09:00.0")
    assert s.attr(NVME, "vendor") == "0x1b36" and s.attr(NVME, "nope") is None
    assert s.driver(NVME) == "nvme" and s.driver("0000:09:00.0") is None
    assert s.resources(NVME)[0] == (0xFE000000, 0xFE003FFF, 0x100200)
    assert s.slot_of(NVME) == "1" and s.slot_of(PORT) is None
    assert s.numa_node(NVME) == 0 and s.numa_node(PORT) is None
    assert s.reset_methods(NVME) == ["flr", "bus"]
    assert s.msi_irqs(NVME) == [24, 25]
    assert s.parent_bdf(NVME) == PORT and s.parent_bdf(PORT) is None
    assert len(s.read_config(NVME)) == 4096
    assert s.read_config(NVME, full=True) == (DUMPS / "qemu72-seabios-nvme-1b36-0010.bin").read_bytes()


def test_sysfs_writes_and_errors_name_the_path(fake):
    s = fake.sysfs
    s.write_attr(NVME, "reset", "1")
    assert fake.read_attr(NVME, "reset") == "1"
    s.slot_power("1", False)
    assert fake.slot_value("1") == "0"
    with pytest.raises(OSError, match="devices/0000:01:00.0/no_such_attr"):
        s.write_attr(NVME, "no_such_attr", "1")
    with pytest.raises(OSError, match="slots/9/power"):
        s.slot_power("9", True)


def test_a_bar_mapping_revoked_under_the_read_is_none_not_sigbus(fake, monkeypatch):
    """A driver claiming the BAR (IO_STRICT_DEVMEM) or the device leaving revokes the mapping
    between mmap and the read: a load would be SIGBUS and kill the runtime (seen in a guest:
    hot-add self-checks racing the nvme probe). The file shrinking under the mapping stands in:
    a load past its end is SIGBUS too."""
    from hilconform.runtime import sysfs as sysfs_module

    fake.set_mmio(NVME, 0, bytes(range(16)) * 512)
    resource = Path(fake.sysfs.device_path(NVME, "resource0"))
    real_copy = sysfs_module._copied_by_kernel

    def revoked_first(view):
        os.truncate(resource, 0)
        return real_copy(view)

    monkeypatch.setattr(sysfs_module, "_copied_by_kernel", revoked_first)
    assert fake.sysfs.read_mmio(NVME, 0, offset=4096) is None


def test_sysfs_mmio_inflight_and_aer(fake):
    s = fake.sysfs
    fake.set_mmio(NVME, 0, bytes(range(16)) + b"\xff" * 4080)
    assert s.read_mmio(NVME, 0) == bytes([0, 1, 2, 3])
    assert s.read_mmio(NVME, 0, offset=4, size=8) == bytes(range(4, 12))
    assert s.read_mmio(NVME, 0, offset=16) == b"\xff" * 4
    assert s.read_mmio(NVME, 0, offset=4096) is None  # past the BAR
    assert s.read_mmio(NVME, 2) is None  # no such BAR
    assert s.block_inflight(NVME) == (0, 0)
    fake.set_inflight(NVME, 2, 3)
    assert s.block_inflight(NVME) == (2, 3)
    assert s.block_inflight(PORT) is None  # the nvme below the port is not the port's queue
    counters = s.aer_counters(PORT)
    assert set(counters) == {"correctable", "nonfatal", "fatal"}
    assert counters["fatal"]["TOTAL_ERR_FATAL"] == 0
    fake.bump_aer(PORT, "fatal", "DLP")
    assert s.aer_counters(PORT)["fatal"]["TOTAL_ERR_FATAL"] == 1
    assert s.aer_counters(NVME) == {}


def test_block_inflight_walk_for_other_block_devices(tmp_path):
    fake = FakeSysfs(tmp_path)
    dev = fake.add_device("0000:00:02.0", nvme_config(), driver="virtio-pci")
    disk = dev / "virtio1" / "block" / "vda"
    (disk / "vda1").mkdir(parents=True)
    for d, text in ((disk, "       1        4\n"), (disk / "vda1", "       1        0\n")):
        (d / "dev").write_text("254:0\n")
        (d / "inflight").write_text(text)
    assert fake.sysfs.block_inflight("0000:00:02.0") == (1, 4)  # the partition is part of its disk


# --- describe -------------------------------------------------------------------------
def test_describe_nvme(fake):
    info = describe(fake.sysfs, NVME)
    assert info.ids == "1b36:0010" and info.class_code == 0x010802 and info.revision == 2
    assert (info.subsystem_vendor_id, info.subsystem_id) == (0x1AF4, 0x1100)
    assert info.bars == [
        {"index": 0, "kind": "mem64", "prefetchable": False, "size": 0x4000, "address": 0xFE000000}
    ]
    caps = info.capabilities
    assert caps["pcie"] and caps["pm"] and caps["msix"] and caps["flr"]
    assert not caps["aer"] and not caps["msi"] and caps["dsn"] is None
    assert caps["msix_table_size"] == 65 and caps["port_type"] == "endpoint"
    assert info.link == {
        "cap_speed_gts": 2.5,
        "cap_width": 1,
        "speed_gts": 2.5,
        "width": 1,
        "active": True,
    }
    assert (info.driver, info.slot, info.numa_node, info.serial) == ("nvme", "1", 0, "SN-A")
    assert info.reset_methods == ["flr", "bus"]
    assert info.config_present and info.identity_basis == "serial" and len(info.fingerprint) == 16


def test_describe_root_port_link_uses_dll_link_active(fake):
    info = describe(fake.sysfs, PORT)
    assert info.link["active"] is True and info.link["cap_speed_gts"] == 16.0
    fake.set_config(PORT, root_port_config(dll_active=False))
    assert describe(fake.sysfs, PORT).link["active"] is False


def test_to_dict_is_json_safe_with_documented_id_format(fake):
    d = describe(fake.sysfs, NVME).to_dict()
    json.dumps(d)
    assert (d["vendor_id"], d["device_id"], d["class_code"], d["revision"]) == (
        "1b36",
        "0010",
        "010802",
        "02",
    )
    assert (d["subsystem_vendor_id"], d["subsystem_id"]) == ("1af4", "1100")
    assert "config" not in d


def test_describe_vanished_device_raises_device_gone(fake):
    fake.remove_device(NVME)
    with pytest.raises(DeviceGone):
        describe(fake.sysfs, NVME)


def test_describe_lost_config_keeps_identity_from_cache_and_previous(fake):
    before = describe(fake.sysfs, NVME)
    fake.lose_config(NVME)
    after = describe(fake.sysfs, NVME, previous=before)
    assert after.config_present is False
    assert after.ids == "1b36:0010" and after.class_code == 0x010802  # from the kernel's cached attributes
    assert after.capabilities["pcie"] is False and after.link == {}
    assert after.fingerprint == before.fingerprint
    assert fake.sysfs.read_mmio(NVME, 0) == b"\xff\xff\xff\xff"


def test_describe_header_only_config(fake):
    fake.set_config(NVME, (DUMPS / "qemu72-seabios-nvme-1b36-0010.bin").read_bytes()[:64])
    info = describe(fake.sysfs, NVME)
    assert info.config_present and info.ids == "1b36:0010"
    assert info.capabilities["config_length"] == 64 and not info.capabilities["pcie"]


def test_describe_io_bar_and_driverless_edu(tmp_path):
    fake = FakeSysfs(tmp_path)
    fake.add_device(
        "0000:00:05.0",
        edu_config(),
        resource=[mem_bar(0xFEA00000, 1 << 20, mem64=False), io_bar(0xC000, 0x40)],
    )
    info = describe(fake.sysfs, "0000:00:05.0")
    assert [(b["index"], b["kind"], b["size"]) for b in info.bars] == [
        (0, "mem32", 1 << 20),
        (1, "io", 0x40),
    ]
    assert info.driver is None and info.ids == "1234:11e8" and info.capabilities["msi"]
    assert info.link == {} and info.identity_basis == "location"


# --- fingerprints ----------------------------------------------------------------------
def _two_hosts(tmp_path, **kwargs):
    """The same device seen by two runtime starts (different roots, different times)."""
    infos = []
    for name in ("boot1", "boot2"):
        fake = FakeSysfs(tmp_path / name)
        fake.add_device(NVME, **kwargs)
        infos.append(describe(fake.sysfs, NVME))
    return infos


@pytest.mark.parametrize(
    "kwargs",
    [
        {"config": nvme_config(serial=0xABCDEF)},
        {"config": nvme_config(), "nvme_serial": "SN-1", "driver": "nvme"},
        {"config": edu_config(), "slot": "4"},
    ],
    ids=["dsn", "nvme-serial", "location"],
)
def test_fingerprint_stable_across_restarts(tmp_path, kwargs):
    first, second = _two_hosts(tmp_path, **kwargs)
    assert first.fingerprint == second.fingerprint == fingerprint(first)


def test_fingerprint_distinct_for_two_devices_of_one_model(tmp_path):
    fake = FakeSysfs(tmp_path)
    fake.add_device("0000:01:00.0", nvme_config(), nvme_serial="SN-1", slot="1")
    fake.add_device("0000:02:00.0", nvme_config(), nvme_serial="SN-2", slot="2")
    fake.add_device("0000:03:00.0", edu_config(), slot="3")
    fake.add_device("0000:04:00.0", edu_config(), slot="4")
    fake.add_device("0000:05:00.0", nvme_config(serial=1))
    fake.add_device("0000:06:00.0", nvme_config(serial=2))
    fps = [describe(fake.sysfs, bdf).fingerprint for bdf in fake.sysfs.pci_addresses()]
    assert len(set(fps)) == len(fps)


def test_dsn_wins_over_serial_and_follows_the_device(tmp_path):
    a = FakeSysfs(tmp_path / "a")
    a.add_device("0000:01:00.0", nvme_config(serial=7), nvme_serial="SN", slot="1")
    b = FakeSysfs(tmp_path / "b")
    b.add_device("0000:05:00.0", nvme_config(serial=7), nvme_serial="SN", slot="5")  # moved slots
    ia, ib = describe(a.sysfs, "0000:01:00.0"), describe(b.sysfs, "0000:05:00.0")
    assert ia.identity_basis == "dsn" and ia.fingerprint == ib.fingerprint


def test_unique_fingerprints_separates_duplicate_serials(tmp_path):
    fake = FakeSysfs(tmp_path)
    fake.add_device("0000:01:00.0", nvme_config(), nvme_serial="SAME", slot="1")
    fake.add_device("0000:02:00.0", nvme_config(), nvme_serial="SAME", slot="2")
    infos = [describe(fake.sysfs, bdf) for bdf in fake.sysfs.pci_addresses()]
    assert infos[0].fingerprint == infos[1].fingerprint
    unique_fingerprints(infos)
    assert infos[0].fingerprint != infos[1].fingerprint
    assert infos[0].identity_basis == "serial+location"


# --- identity registry -------------------------------------------------------------------
def _nvme_in_slot(tmp_path, serial, name, driver_bound=True):
    fake = FakeSysfs(tmp_path / name)
    fake.add_device(NVME, nvme_config(), slot="1", nvme_serial=serial if driver_bound else None)
    return describe(fake.sysfs, NVME)


def test_identity_change_in_place_is_flagged(tmp_path):
    reg = IdentityRegistry()
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-1", "a")) is False
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-1", "b")) is False
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-2", "c")) is True
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-2", "d")) is False


def test_serial_appearing_after_bind_is_not_a_change(tmp_path):
    reg = IdentityRegistry()
    early = _nvme_in_slot(tmp_path, None, "a", driver_bound=False)
    assert early.identity_basis == "location"
    assert reg.observe(early) is False
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-1", "b")) is False
    assert reg.observe(_nvme_in_slot(tmp_path, None, "c", driver_bound=False)) is False  # unbound again
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-9", "d")) is True


def test_other_model_in_the_slot_is_a_change_whatever_came_between(tmp_path):
    reg = IdentityRegistry()
    nvme = _nvme_in_slot(tmp_path, "SN-1", "a")
    reg.observe(nvme)
    fake = FakeSysfs(tmp_path / "edu")
    fake.add_device(NVME, edu_config(), slot="1")
    edu = describe(fake.sysfs, NVME)
    assert reg.observe(edu) is True
    # the slot remembers its last unit (an orderly removal forgets nothing): the nvme back is a change too
    assert reg.observe(nvme) is True
    assert reg.observe(nvme) is False  # and then the same unit again is not


def test_renumbered_bus_without_serial_is_not_a_change(tmp_path):
    reg = IdentityRegistry()
    for name, bdf in (("a", "0000:04:00.0"), ("b", "0000:05:00.0")):
        fake = FakeSysfs(tmp_path / name)
        fake.add_device(bdf, edu_config(), slot="4")
        assert reg.observe(describe(fake.sysfs, bdf)) is False


def test_lost_config_is_not_an_identity_change(tmp_path, fake):
    reg = IdentityRegistry()
    reg.observe(describe(fake.sysfs, NVME))
    fake.lose_config(NVME)
    assert reg.observe(describe(fake.sysfs, NVME)) is False


def test_registry_persists_across_restarts(tmp_path):
    path = tmp_path / "state" / "identity.json"
    IdentityRegistry(str(path)).observe(_nvme_in_slot(tmp_path, "SN-1", "a"))
    assert json.loads(path.read_text())["slot:1"]["basis"] == "serial"
    after_reboot = IdentityRegistry(str(path))
    assert after_reboot.observe(_nvme_in_slot(tmp_path, "SN-1", "b")) is False
    assert after_reboot.observe(_nvme_in_slot(tmp_path, "SN-2", "c")) is True
    assert IdentityRegistry(str(path)).observe(_nvme_in_slot(tmp_path, "SN-2", "d")) is False


def test_registry_tolerates_unwritable_and_corrupt_files(tmp_path):
    corrupt = tmp_path / "identity.json"
    corrupt.write_text("{not json")
    reg = IdentityRegistry(str(corrupt))
    assert "cannot load" in reg.last_error
    blocker = tmp_path / "file"
    blocker.write_text("")
    reg = IdentityRegistry(os.path.join(blocker, "sub", "identity.json"))
    assert reg.observe(_nvme_in_slot(tmp_path, "SN-1", "a")) is False
    assert "cannot save" in reg.last_error
