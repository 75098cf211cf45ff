"""Configuration space built from a model: IDs, BAR sizing, capability chains, FLR, link status."""

import struct

from hilconform.emulators.vfio_user.config_space import ConfigSpace
from hilconform.emulators.vfio_user.model import load_model


def u16(cs, off):
    return struct.unpack_from("<H", cs.data, off)[0]


def u32(cs, off):
    return struct.unpack_from("<I", cs.data, off)[0]


def walk_standard(cs):
    caps, at = [], cs.data[0x34]
    while at:
        caps.append((cs.data[at], at))
        at = cs.data[at + 1]
    return caps


def walk_extended(cs):
    caps, at = [], 0x100
    while at:
        header = u32(cs, at)
        caps.append((header & 0xFFFF, at))
        at = header >> 20
    return caps


def test_identity_and_capability_chains():
    cs = ConfigSpace(load_model("a100-sxm4"))
    assert (u16(cs, 0), u16(cs, 2)) == (0x10DE, 0x20B0)
    assert (cs.data[0x0B], cs.data[0x0A], cs.data[0x08]) == (0x03, 0x02, 0xA1)
    assert (u16(cs, 0x2C), u16(cs, 0x2E)) == (0x10DE, 0x134F)
    assert u16(cs, 0x06) & 0x10
    assert walk_standard(cs) == [(0x01, 0x60), (0x10, 0x78)]
    assert walk_extended(cs) == [(0x0001, 0x100), (0x0003, 0x148)]
    assert struct.unpack_from("<Q", cs.data, 0x148 + 4)[0] == load_model("a100-sxm4").serial_number


def test_link_capability_and_status_follow_the_model_and_faults():
    cs = ConfigSpace(load_model("t4"))
    lnkcap = u32(cs, cs.pcie + 0x0C)
    assert (lnkcap & 0xF, (lnkcap >> 4) & 0x3F) == (3, 16)  # 8 GT/s x16
    assert cs.link_status() == (3, 16)
    cs.set_link("2_5", 4)
    assert cs.link_status() == (1, 4)
    assert u32(cs, cs.pcie + 0x0C) == lnkcap  # the capability does not change


def test_bar_sizing_as_hardware_does_it():
    cs = ConfigSpace(load_model("a100-sxm4"))
    cs.write(0x10, b"\xff\xff\xff\xff")
    assert u32(cs, 0x10) == (~(16 << 20) + 1) & 0xFFFFFFF0  # 16 MiB, 32-bit, non-prefetchable
    cs.write(0x14, b"\xff\xff\xff\xff")
    cs.write(0x18, b"\xff\xff\xff\xff")
    size_low = u32(cs, 0x14)
    assert size_low & 0xF == 0xC  # 64-bit prefetchable
    size = ((u32(cs, 0x18) << 32) | (size_low & ~0xF)) ^ ((1 << 64) - 1)
    assert size + 1 == 256 << 20


def test_read_only_and_unknown_registers_drop_writes():
    cs = ConfigSpace(load_model("a100-sxm4"))
    before = bytes(cs.data)
    cs.write(0x00, b"\x00\x00\x00\x00")  # IDs
    cs.write(0x488, b"\x00\x00\x00\x02")  # the guest kernel's NVIDIA HDA quirk
    assert bytes(cs.data) == before


def test_flr_calls_back_and_reads_as_zero():
    calls = []
    cs = ConfigSpace(load_model("a100-sxm4"), on_flr=lambda: calls.append(1))
    assert u32(cs, cs.pcie + 4) & (1 << 28)  # FLR capable
    devctl = cs.pcie + 8
    cs.write(devctl, struct.pack("<H", u16(cs, devctl) | 0x8000))
    assert calls == [1]
    assert not u16(cs, devctl) & 0x8000


def test_aer_status_is_write_one_to_clear():
    cs = ConfigSpace(load_model("a100-sxm4"))
    cs.set_aer_status(uncorrectable=0x10)
    assert u32(cs, 0x104) == 0x10
    cs.write(0x104, struct.pack("<I", 0x10))
    assert u32(cs, 0x104) == 0


def test_clear_bars_keeps_type_bits():
    cs = ConfigSpace(load_model("a100-sxm4"))
    cs.write(0x04, b"\x06\x00")
    cs.write(0x10, struct.pack("<I", 0xFD000000))
    cs.clear_bars()
    assert u32(cs, 0x10) == 0 and u16(cs, 0x04) == 0
    assert u32(cs, 0x14) & 0xF == 0xC
