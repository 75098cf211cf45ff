"""Config-space parser: real dumps (tests/data/pci-config), hand-built layouts, fuzzing."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from fakesysfs import ConfigBuilder, edu_config, nvme_config, root_port_config
from hypothesis import given, settings
from hypothesis import strategies as st

from hilconform.runtime.pciconfig import parse_config, sparse_config

DUMPS = Path(__file__).resolve().parents[2] / "data" / "pci-config"
EXPECTED = tomllib.loads((DUMPS / "expected.toml").read_text())
NOT_FACTS = {"source", "notes"}


def facts(raw: bytes) -> dict:
    """The flat facts expected.toml may state about a dump."""
    c = parse_config(raw)
    p = c.pcie
    slot = p.slot_caps if p else None

    def hexid(v, digits=4):
        return None if v is None else f"{v:0{digits}x}"

    return {
        "present": c.present,
        "length": c.length,
        "vendor_id": hexid(c.vendor_id),
        "device_id": hexid(c.device_id),
        "subsystem_vendor_id": hexid(c.subsystem_vendor_id),
        "subsystem_id": hexid(c.subsystem_id),
        "class_code": hexid(c.class_code, 6),
        "revision": c.revision,
        "header_type": c.header_type,
        "bus_master": c.bus_master,
        "bars": [f"{b.index}:{b.kind}{':pf' if b.prefetchable else ''}" for b in c.bars],
        "capabilities": [cap.name for cap in c.capabilities],
        "extended_capabilities": [cap.name for cap in c.extended_capabilities],
        "pm": c.pm,
        "aer": c.aer,
        "dsn": c.dsn,
        "flr": c.flr,
        "msi": c.msi is not None,
        "msi_vectors": c.msi.vectors if c.msi else None,
        "msix": c.msix is not None,
        "msix_table_size": c.msix.table_size if c.msix else None,
        "msix_enabled": bool(c.msix and c.msix.enabled),
        "pcie": p is not None,
        "pcie_port_type": p.port_type if p else None,
        "link_cap_speed_gts": p.link_cap_speed_gts if p else None,
        "link_cap_width": p.link_cap_width if p else None,
        "link_status_speed_gts": p.link_status_speed_gts if p else None,
        "link_status_width": p.link_status_width if p else None,
        "dll_link_active": p.dll_link_active if p else None,
        "slot_implemented": p.slot_implemented if p else None,
        "slot_number": slot["number"] if slot else None,
        "hot_plug_capable": slot["hot_plug_capable"] if slot else None,
        "problems": list(c.problems),
    }


def test_every_dump_has_an_expected_entry():
    dumps = sorted(p.name for p in DUMPS.glob("*.bin"))
    assert dumps, f"no dumps in {DUMPS}"
    missing = [d for d in dumps if d not in EXPECTED]
    assert not missing, f"add entries for {missing} to {DUMPS / 'expected.toml'}"
    stale = [name for name in EXPECTED if name not in dumps]
    assert not stale, f"expected.toml names dumps that are not there: {stale}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dump_matches_expected_values(name):
    got = facts((DUMPS / name).read_bytes())
    want = {k: None if v == "none" else v for k, v in EXPECTED[name].items() if k not in NOT_FACTS}
    unknown = sorted(set(want) - set(got))
    assert not unknown, f"expected.toml [{name!r}] has unknown keys {unknown}; known: {sorted(got)}"
    differ = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
    assert not differ, f"{name}: (expected, parsed) = {differ}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dump_to_dict_is_json_safe(name):
    json.dumps(parse_config((DUMPS / name).read_bytes()).to_dict())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dump_read_unprivileged_or_truncated(name):
    raw = (DUMPS / name).read_bytes()
    full, legacy, header = parse_config(raw), parse_config(raw[:256]), parse_config(raw[:64])
    assert legacy.capabilities == full.capabilities and legacy.extended_capabilities == ()
    assert legacy.pcie == full.pcie and legacy.msix == full.msix and legacy.dsn is None
    assert (header.vendor_id, header.device_id, header.class_code) == (
        full.vendor_id,
        full.device_id,
        full.class_code,
    )
    assert header.capabilities == ()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sparse_read_parses_like_the_full_dump(name):
    raw = (DUMPS / name).read_bytes()
    reads = []

    def read_at(offset, size):
        reads.append(size)
        return raw[offset : offset + size]

    sparse = sparse_config(raw[:256], read_at)
    assert parse_config(sparse) == parse_config(raw)
    assert sum(reads) <= 64  # a few headers, not the 3840 bytes of extended space


def test_sparse_read_stops_when_the_extended_space_is_unreadable():
    raw = nvme_config(serial=9)
    assert sparse_config(raw[:256], lambda offset, size: b"") == raw[:256]
    assert sparse_config(b"\xff" * 256, lambda offset, size: 1 / 0) == b"\xff" * 256


# --- hand-built layouts ------------------------------------------------------------
def test_header_fields():
    b = ConfigBuilder(
        vendor=0x10DE, device=0x20B0, class_code=0x030200, revision=0xA1, subsystem=(0x10DE, 0x134F)
    )
    b.bar(0, 0xFB000000)
    b.bar(1, 0x0000000C)  # 64-bit prefetchable, low dword
    b.bar(2, 0x00000038)  # high dword of BAR1
    b.bar(3, 0x0000E001)  # I/O
    c = parse_config(b.build())
    assert (c.vendor_id, c.device_id, c.class_code, c.revision) == (0x10DE, 0x20B0, 0x030200, 0xA1)
    assert (c.subsystem_vendor_id, c.subsystem_id) == (0x10DE, 0x134F)
    assert c.present and c.bus_master and c.memory_enabled
    kinds = [(bar.index, bar.kind, bar.prefetchable, bar.address) for bar in c.bars]
    assert kinds == [
        (0, "mem32", False, 0xFB000000),
        (1, "mem64", True, 0x38_0000_0000),
        (3, "io", False, 0xE000),
    ]
    assert c.to_dict()["vendor_id"] == "10de" and c.to_dict()["class_code"] == "030200"


@pytest.mark.parametrize(
    "link_cap, link_status, speeds",
    [
        ((1, 1), (1, 1), (2.5, 1, 2.5, 1)),
        ((4, 16), (3, 8), (16.0, 16, 8.0, 8)),
        ((5, 16), (0, 0), (32.0, 16, None, 0)),
    ],
)
def test_pcie_link_fields(link_cap, link_status, speeds):
    b = ConfigBuilder()
    b.pcie(link_cap=link_cap, link_status=link_status)
    p = parse_config(b.build()).pcie
    assert (
        p.link_cap_speed_gts,
        p.link_cap_width,
        p.link_status_speed_gts,
        p.link_status_width,
    ) == speeds
    assert p.port_type == "endpoint" and not p.slot_implemented and p.slot_caps is None


def test_flr_bit():
    with_flr, without = ConfigBuilder(), ConfigBuilder()
    with_flr.pcie(flr=True)
    without.pcie(flr=False)
    assert parse_config(with_flr.build()).flr is True
    assert parse_config(without.build()).flr is False


def test_root_port_slot_and_dll_link_active():
    c = parse_config(root_port_config(slot_number=7, dll_active=True))
    p = c.pcie
    assert p.port_type == "root_port" and p.slot_implemented
    assert p.slot_caps["number"] == 7 and p.slot_caps["hot_plug_capable"] and p.slot_caps["attention_button"]
    assert p.slot_status["presence_detect"] and p.slot_control["hot_plug_interrupt_enable"]
    assert p.dll_link_active and p.dll_link_active_reporting
    assert c.header_type == 1 and c.subsystem_vendor_id is None and c.aer
    down = parse_config(root_port_config(dll_active=False)).pcie
    assert not down.dll_link_active and down.link_status_width == 0


def test_msi_and_msix():
    b = ConfigBuilder()
    b.msi(enabled=True, vectors_log2=3, enabled_log2=2)
    b.msix(table_size=65, enabled=True, table_bar=4, table_offset=0x2000, pba_bar=4, pba_offset=0x3000)
    c = parse_config(b.build())
    assert (c.msi.enabled, c.msi.vectors, c.msi.vectors_enabled, c.msi.is_64bit) == (
        True,
        8,
        4,
        True,
    )
    m = c.msix
    assert (m.enabled, m.table_size, m.table_bar, m.table_offset, m.pba_bar, m.pba_offset) == (
        True,
        65,
        4,
        0x2000,
        4,
        0x3000,
    )
    assert [cap.name for cap in c.capabilities] == ["msi", "msix"]


def test_aer_and_dsn_extended_capabilities():
    b = ConfigBuilder()
    b.pcie()
    b.aer()
    b.dsn(0x0011223344556677)
    c = parse_config(b.build())
    assert c.aer
    assert c.dsn == "00-11-22-33-44-55-66-77"
    assert [(x.name, x.offset) for x in c.extended_capabilities] == [("aer", 0x100), ("dsn", 0x148)]
    assert c.extended_capabilities[0].version == 2


def test_capability_loop_terminates_and_is_reported():
    b = ConfigBuilder()
    first = b.pm()
    second = b.msi()
    b.u8(second + 1, first)  # msi -> pm -> msi -> ...
    c = parse_config(b.build())
    assert [cap.name for cap in c.capabilities] == ["pm", "msi"]
    assert any("loops" in p for p in c.problems)


def test_extended_capability_loop_terminates():
    b = ConfigBuilder()
    first = b.aer()
    b.dsn(1)
    b.u32(0x148, 0x0003 | 1 << 16 | first << 20)  # dsn -> aer
    c = parse_config(b.build())
    assert [x.name for x in c.extended_capabilities] == ["aer", "dsn"]
    assert any("loops" in p for p in c.problems)


def test_pointer_into_header_is_reported():
    b = ConfigBuilder()
    off = b.pm()
    b.u8(off + 1, 0x10)
    c = parse_config(b.build())
    assert [cap.name for cap in c.capabilities] == ["pm"]
    assert any("header" in p for p in c.problems)


def test_truncated_256_bytes_has_no_extended_capabilities():
    raw = nvme_config(serial=0x1234)
    full, short = parse_config(raw), parse_config(raw[:256])
    assert full.dsn == "00-00-00-00-00-00-12-34"
    assert short.extended_capabilities == () and short.dsn is None and not short.aer
    assert short.pcie == full.pcie and short.length == 256


def test_header_only_64_bytes_unprivileged_read():
    c = parse_config(nvme_config()[:64])
    assert c.present and c.vendor_id == 0x1B36 and c.capabilities == ()
    assert any("beyond" in p for p in c.problems)


@pytest.mark.parametrize("size", [64, 256, 4096])
def test_all_ones_config_is_not_present(size):
    c = parse_config(b"\xff" * size)
    assert c.present is False and c.vendor_id == 0xFFFF
    assert c.capabilities == () and c.pcie is None and c.bars == ()
    json.dumps(c.to_dict())


def test_too_short_raises_value_error():
    with pytest.raises(ValueError, match="too short"):
        parse_config(b"\x00" * 63)


def test_emulated_device_shapes():
    edu = parse_config(edu_config())
    assert (edu.vendor_id, edu.device_id, edu.class_code) == (0x1234, 0x11E8, 0x00FF00)
    assert edu.pcie is None and edu.msi is not None and not edu.flr


# --- fuzzing -------------------------------------------------------------------------
@settings(max_examples=300, deadline=2000)
@given(st.binary(min_size=0, max_size=4200))
def test_arbitrary_bytes_parse_or_raise_value_error(raw):
    try:
        c = parse_config(raw)
    except ValueError:
        assert len(raw) < 64
        return
    json.dumps(c.to_dict())


def _mutated(base: bytes):
    return st.lists(st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255)), max_size=64).map(
        lambda edits: _apply(base, edits)
    )


def _apply(base: bytes, edits) -> bytes:
    buf = bytearray(base)
    for off, value in edits:
        buf[off] = value
    return bytes(buf)


@settings(max_examples=300, deadline=2000)
@given(
    st.one_of(_mutated(nvme_config(serial=5)), _mutated(root_port_config())),
    st.sampled_from([64, 255, 256, 300, 4096]),
)
def test_mutated_real_layouts_never_fail(raw, cut):
    c = parse_config(raw[:cut])
    json.dumps(c.to_dict())
    assert len(c.capabilities) <= 64 and len(c.extended_capabilities) <= 64
