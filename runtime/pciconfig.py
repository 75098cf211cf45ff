"""PCI configuration-space parser (pure, no I/O).

Why a parser of our own: the runtime needs link, FLR, MSI/MSI-X, AER and DSN
facts from the sysfs ``config`` bytes without lspci, and must survive
truncated, looping or all-ones (device gone) config space. Register layouts
follow the PCI Local Bus and PCI Express Base specifications.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

HEADER_SIZE = 64  # the part every reader may see (unprivileged sysfs reads stop here)
LEGACY_SIZE = 256
EXTENDED_SIZE = 4096
_MAX_CHAIN = 64  # more entries than fit in the space: the chain loops

CAP_NAMES = {
    0x01: "pm",
    0x02: "agp",
    0x03: "vpd",
    0x04: "slot_id",
    0x05: "msi",
    0x06: "hot_swap",
    0x07: "pcix",
    0x08: "hypertransport",
    0x09: "vendor_specific",
    0x0A: "debug_port",
    0x0B: "cpci_crc",
    0x0C: "hot_plug",
    0x0D: "ssvid",
    0x0E: "agp3",
    0x0F: "secure",
    0x10: "pcie",
    0x11: "msix",
    0x12: "sata",
    0x13: "af",
    0x14: "ea",
    0x15: "fpb",
}
EXT_CAP_NAMES = {
    0x01: "aer",
    0x02: "vc",
    0x03: "dsn",
    0x04: "power_budget",
    0x05: "rclink",
    0x06: "rcilink",
    0x07: "rcec",
    0x08: "mfvc",
    0x09: "vc9",
    0x0A: "rcrb",
    0x0B: "vsec",
    0x0C: "cac",
    0x0D: "acs",
    0x0E: "ari",
    0x0F: "ats",
    0x10: "sriov",
    0x11: "mriov",
    0x12: "multicast",
    0x13: "pri",
    0x15: "rebar",
    0x16: "dpa",
    0x17: "tph",
    0x18: "ltr",
    0x19: "secondary_pcie",
    0x1A: "pmux",
    0x1B: "pasid",
    0x1C: "lnr",
    0x1D: "dpc",
    0x1E: "l1ss",
    0x1F: "ptm",
    0x20: "mpcie",
    0x21: "frs",
    0x22: "rtr",
    0x23: "dvsec",
    0x24: "vf_rebar",
    0x25: "dlf",
    0x26: "pl_16gt",
    0x27: "lane_margining",
    0x28: "hierarchy_id",
    0x29: "npem",
    0x2A: "pl_32gt",
    0x2B: "alt_protocol",
    0x2C: "sfi",
    0x2E: "doe",
    0x30: "ide",
    0x31: "pl_64gt",
}
PORT_TYPES = {
    0: "endpoint",
    1: "legacy_endpoint",
    4: "root_port",
    5: "upstream_port",
    6: "downstream_port",
    7: "pcie_to_pci_bridge",
    8: "pci_to_pcie_bridge",
    9: "rc_integrated_endpoint",
    10: "rc_event_collector",
}
LINK_SPEEDS_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


@dataclass(frozen=True)
class Capability:
    """One entry of the (extended) capability chain; ``version`` only for extended ones."""

    id: int
    offset: int
    name: str
    version: int = 0


@dataclass(frozen=True)
class Bar:
    """A decoded BAR register (address as programmed; the size comes from sysfs ``resource``)."""

    index: int
    kind: str  # "mem32" | "mem64" | "io"
    prefetchable: bool
    address: int


@dataclass(frozen=True)
class PcieInfo:
    """PCI Express capability. Link fields are None where the port type has no link."""

    version: int
    port_type: str
    port_type_code: int
    flr: bool
    max_payload_supported: int
    link_cap_speed_gts: float | None
    link_cap_width: int | None
    link_status_speed_gts: float | None
    link_status_width: int | None
    dll_link_active: bool
    dll_link_active_reporting: bool
    slot_implemented: bool
    slot_caps: dict | None = None
    slot_control: dict | None = None
    slot_status: dict | None = None


@dataclass(frozen=True)
class MsiInfo:
    enabled: bool
    vectors: int  # vectors the function can request (Multiple Message Capable)
    vectors_enabled: int
    is_64bit: bool
    per_vector_masking: bool


@dataclass(frozen=True)
class MsixInfo:
    enabled: bool
    table_size: int
    function_mask: bool
    table_bar: int
    table_offset: int
    pba_bar: int
    pba_offset: int


@dataclass(frozen=True)
class ConfigSpace:
    """Parsed config space.

    ``present`` is False when the IDs read all ones (or zero): the device fell
    off the bus or lost its config; nothing else is parsed then. ``problems``
    lists what was wrong with the chains (loops, bad pointers, truncation);
    parsing goes around them instead of failing.
    """

    present: bool
    length: int
    vendor_id: int
    device_id: int
    command: int = 0
    status: int = 0
    revision: int = 0
    class_code: int = 0  # 24 bits: base class << 16 | subclass << 8 | prog-if
    header_type: int = 0  # 0 endpoint, 1 bridge, 2 cardbus (multi-function bit removed)
    multifunction: bool = False
    subsystem_vendor_id: int | None = None
    subsystem_id: int | None = None
    bar_registers: tuple[int, ...] = ()  # raw BAR dwords (6 for endpoints, 2 for bridges)
    bars: tuple[Bar, ...] = ()  # decoded, registers reading 0 left out
    capabilities: tuple[Capability, ...] = ()
    extended_capabilities: tuple[Capability, ...] = ()
    pcie: PcieInfo | None = None
    pm: bool = False
    pm_state: int | None = None  # 0..3 = D0..D3hot
    msi: MsiInfo | None = None
    msix: MsixInfo | None = None
    aer: bool = False
    dsn: str | None = None  # "xx-xx-xx-xx-xx-xx-xx-xx", most significant byte first (as lspci)
    problems: tuple[str, ...] = ()

    @property
    def bus_master(self) -> bool:
        return bool(self.command & 0x4)

    @property
    def memory_enabled(self) -> bool:
        return bool(self.command & 0x2)

    @property
    def flr(self) -> bool:
        return bool(self.pcie and self.pcie.flr)

    def capability(self, name: str) -> Capability | None:
        """First standard or extended capability called ``name``."""
        for cap in self.capabilities + self.extended_capabilities:
            if cap.name == name:
                return cap
        return None

    def to_dict(self) -> dict:
        """JSON-safe dict; IDs as lowercase hex strings without "0x" (4 digits, class 6)."""
        out = asdict(self)
        for key in ("vendor_id", "device_id", "subsystem_vendor_id", "subsystem_id"):
            if out[key] is not None:
                out[key] = f"{out[key]:04x}"
        out["class_code"] = f"{self.class_code:06x}"
        out["bus_master"] = self.bus_master
        out["flr"] = self.flr
        for key in ("bar_registers", "bars", "capabilities", "extended_capabilities", "problems"):
            out[key] = list(out[key])
        return out


class _Reader:
    """Little-endian register reads that answer None outside the bytes we have."""

    def __init__(self, raw: bytes):
        self.raw = raw

    def u8(self, off: int) -> int | None:
        return self.raw[off] if 0 <= off < len(self.raw) else None

    def u16(self, off: int) -> int | None:
        if off < 0 or off + 2 > len(self.raw):
            return None
        return int.from_bytes(self.raw[off : off + 2], "little")

    def u32(self, off: int) -> int | None:
        if off < 0 or off + 4 > len(self.raw):
            return None
        return int.from_bytes(self.raw[off : off + 4], "little")


# extended capabilities whose body the parser reads: id -> bytes after the header
_EXT_BODY_BYTES = {0x0003: 8}  # DSN


def sparse_config(legacy: bytes, read_at: Callable[[int, int], bytes]) -> bytes:
    """Config bytes that parse exactly like the full 4 KiB, fetching from the
    extended space only the capability headers (and the DSN body).

    Why: each config dword read is a bus transaction (a VM exit when
    virtualised: ~25 us each seen here, 4 KiB took 24 ms), and hot-add latency
    counts. ``legacy`` is the first 256 bytes; ``read_at(offset, size)`` reads
    more (short or empty when not possible). Unread bytes are zero.
    """
    if len(legacy) < LEGACY_SIZE or int.from_bytes(legacy[:2], "little") in (0xFFFF, 0):
        return bytes(legacy)
    buf = bytearray(EXTENDED_SIZE)
    buf[:LEGACY_SIZE] = legacy[:LEGACY_SIZE]
    ptr, seen = LEGACY_SIZE, set()
    while ptr and ptr not in seen and len(seen) < _MAX_CHAIN:
        seen.add(ptr)
        header = read_at(ptr, 4)
        if len(header) < 4:
            return bytes(buf[:ptr]) if ptr == LEGACY_SIZE else bytes(buf)
        buf[ptr : ptr + 4] = header
        value = int.from_bytes(header, "little")
        if value in (0, 0xFFFFFFFF):
            break
        body = _EXT_BODY_BYTES.get(value & 0xFFFF, 0)
        if body and ptr + 4 + body <= EXTENDED_SIZE:
            chunk = read_at(ptr + 4, body)
            buf[ptr + 4 : ptr + 4 + len(chunk)] = chunk
        ptr = (value >> 20) & 0xFFC
        if ptr < LEGACY_SIZE:
            break
    return bytes(buf)


def parse_config(raw: bytes) -> ConfigSpace:
    """Parse sysfs ``config`` bytes.

    Raises ValueError only when ``raw`` is shorter than the 64-byte header;
    anything longer parses (bytes past 4096 are ignored), never loops forever.
    """
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ValueError(f"config must be bytes, not {type(raw).__name__}")
    raw = bytes(raw[:EXTENDED_SIZE])
    if len(raw) < HEADER_SIZE:
        raise ValueError(f"config space too short: {len(raw)} bytes < {HEADER_SIZE}")
    r = _Reader(raw)
    vendor_id, device_id = r.u16(0), r.u16(2)
    if vendor_id in (0xFFFF, 0x0000):
        return ConfigSpace(present=False, length=len(raw), vendor_id=vendor_id, device_id=device_id)

    problems: list[str] = []
    header_byte = r.u8(0x0E)
    header_type = header_byte & 0x7F
    bar_count = {0: 6, 1: 2}.get(header_type, 0)
    bar_registers = tuple(r.u32(0x10 + 4 * i) for i in range(bar_count))
    caps = _walk_capabilities(r, header_type, r.u16(0x06), problems)
    ext_caps = _walk_extended(r, problems)

    subsystem_vendor_id = subsystem_id = None
    if header_type == 0:
        subsystem_vendor_id, subsystem_id = r.u16(0x2C), r.u16(0x2E)
    elif header_type == 2:
        subsystem_vendor_id, subsystem_id = r.u16(0x40), r.u16(0x42)
    ssvid = _first(caps, "ssvid")
    if ssvid is not None and subsystem_vendor_id is None:
        subsystem_vendor_id, subsystem_id = r.u16(ssvid.offset + 4), r.u16(ssvid.offset + 6)

    pm = _first(caps, "pm")
    pm_state = None
    if pm is not None:
        pmcsr = r.u16(pm.offset + 4)
        pm_state = None if pmcsr is None else pmcsr & 0x3
    dsn_cap = _first(ext_caps, "dsn")

    return ConfigSpace(
        present=True,
        length=len(raw),
        vendor_id=vendor_id,
        device_id=device_id,
        command=r.u16(0x04),
        status=r.u16(0x06),
        revision=r.u8(0x08),
        class_code=r.u8(0x0B) << 16 | r.u8(0x0A) << 8 | r.u8(0x09),
        header_type=header_type,
        multifunction=bool(header_byte & 0x80),
        subsystem_vendor_id=subsystem_vendor_id,
        subsystem_id=subsystem_id,
        bar_registers=bar_registers,
        bars=_decode_bars(bar_registers, problems),
        capabilities=caps,
        extended_capabilities=ext_caps,
        pcie=_parse_pcie(r, _first(caps, "pcie")),
        pm=pm is not None,
        pm_state=pm_state,
        msi=_parse_msi(r, _first(caps, "msi")),
        msix=_parse_msix(r, _first(caps, "msix")),
        aer=_first(ext_caps, "aer") is not None,
        dsn=_parse_dsn(r, dsn_cap),
        problems=tuple(problems),
    )


def _first(caps: tuple[Capability, ...], name: str) -> Capability | None:
    return next((c for c in caps if c.name == name), None)


def _decode_bars(registers: tuple[int, ...], problems: list[str]) -> tuple[Bar, ...]:
    bars: list[Bar] = []
    i = 0
    while i < len(registers):
        value = registers[i]
        if value & 0x1:
            if value & ~0x3:
                bars.append(Bar(i, "io", False, value & ~0x3))
            i += 1
            continue
        mem_type = (value >> 1) & 0x3
        prefetchable = bool(value & 0x8)
        if mem_type == 0x2:
            if i + 1 >= len(registers):
                problems.append(f"BAR{i} is 64-bit but is the last BAR")
                high = 0
            else:
                high = registers[i + 1]
            address = (high << 32) | (value & ~0xF)
            if address:
                bars.append(Bar(i, "mem64", prefetchable, address))
            i += 2
            continue
        if value & ~0xF:
            bars.append(Bar(i, "mem32", prefetchable, value & ~0xF))
        i += 1
    return tuple(bars)


def _walk_capabilities(
    r: _Reader, header_type: int, status: int, problems: list[str]
) -> tuple[Capability, ...]:
    if not status & 0x10:  # Status: Capabilities List
        return ()
    ptr = r.u8(0x14 if header_type == 2 else 0x34)
    caps: list[Capability] = []
    seen: set[int] = set()
    ptr = ptr & 0xFC if ptr is not None else 0
    while ptr:
        if ptr < HEADER_SIZE:
            problems.append(f"capability pointer 0x{ptr:02x} points into the header")
            break
        if ptr + 2 > min(len(r.raw), LEGACY_SIZE):
            problems.append(f"capability at 0x{ptr:02x} is beyond the {len(r.raw)} bytes read")
            break
        if ptr in seen or len(caps) >= _MAX_CHAIN:
            problems.append(f"capability chain loops at 0x{ptr:02x}")
            break
        seen.add(ptr)
        cap_id = r.u8(ptr)
        caps.append(Capability(cap_id, ptr, CAP_NAMES.get(cap_id, f"cap_{cap_id:02x}")))
        ptr = r.u8(ptr + 1) & 0xFC
    return tuple(caps)


def _walk_extended(r: _Reader, problems: list[str]) -> tuple[Capability, ...]:
    if len(r.raw) <= LEGACY_SIZE:
        return ()
    caps: list[Capability] = []
    seen: set[int] = set()
    ptr = LEGACY_SIZE
    while ptr:
        header = r.u32(ptr)
        if header is None:
            problems.append(f"extended capability at 0x{ptr:03x} is beyond the {len(r.raw)} bytes read")
            break
        if header in (0, 0xFFFFFFFF):  # empty list (or a hole) ends the chain
            break
        if ptr in seen or len(caps) >= _MAX_CHAIN:
            problems.append(f"extended capability chain loops at 0x{ptr:03x}")
            break
        seen.add(ptr)
        cap_id = header & 0xFFFF
        caps.append(
            Capability(cap_id, ptr, EXT_CAP_NAMES.get(cap_id, f"ext_{cap_id:04x}"), (header >> 16) & 0xF)
        )
        nxt = (header >> 20) & 0xFFC
        if nxt and nxt < LEGACY_SIZE:
            problems.append(f"extended capability pointer 0x{nxt:03x} points below 0x100")
            break
        ptr = nxt
    return tuple(caps)


def _bits(value: int, names: dict[str, int]) -> dict[str, bool]:
    return {name: bool(value & mask) for name, mask in names.items()}


_SLOT_CAP_BITS = {
    "attention_button": 1 << 0,
    "power_controller": 1 << 1,
    "mrl_sensor": 1 << 2,
    "attention_indicator": 1 << 3,
    "power_indicator": 1 << 4,
    "hot_plug_surprise": 1 << 5,
    "hot_plug_capable": 1 << 6,
    "no_command_completed": 1 << 18,
}
_SLOT_CONTROL_BITS = {
    "attention_button_enable": 1 << 0,
    "power_fault_enable": 1 << 1,
    "mrl_changed_enable": 1 << 2,
    "presence_detect_enable": 1 << 3,
    "command_completed_enable": 1 << 4,
    "hot_plug_interrupt_enable": 1 << 5,
    "dll_state_changed_enable": 1 << 12,
}
_SLOT_STATUS_BITS = {
    "attention_button_pressed": 1 << 0,
    "power_fault": 1 << 1,
    "mrl_changed": 1 << 2,
    "presence_detect_changed": 1 << 3,
    "command_completed": 1 << 4,
    "mrl_open": 1 << 5,
    "presence_detect": 1 << 6,
    "dll_state_changed": 1 << 8,
}


def _parse_pcie(r: _Reader, cap: Capability | None) -> PcieInfo | None:
    if cap is None:
        return None
    base = cap.offset
    flags = r.u16(base + 2) or 0
    port_code = (flags >> 4) & 0xF
    devcap = r.u32(base + 4) or 0
    has_link = port_code not in (9, 10)
    lnkcap = r.u32(base + 0x0C) if has_link else None
    lnksta = r.u16(base + 0x12) if has_link else None
    slot_implemented = bool(flags & 0x100)
    slot_caps = slot_control = slot_status = None
    if slot_implemented:
        sltcap, sltctl, sltsta = r.u32(base + 0x14), r.u16(base + 0x18), r.u16(base + 0x1A)
        if sltcap is not None:
            slot_caps = _bits(sltcap, _SLOT_CAP_BITS) | {"number": sltcap >> 19}
        if sltctl is not None:
            slot_control = _bits(sltctl, _SLOT_CONTROL_BITS) | {
                "attention_indicator": (sltctl >> 6) & 0x3,
                "power_indicator": (sltctl >> 8) & 0x3,
                "power_off": bool(sltctl & (1 << 10)),
            }
        if sltsta is not None:
            slot_status = _bits(sltsta, _SLOT_STATUS_BITS)
    return PcieInfo(
        version=flags & 0xF,
        port_type=PORT_TYPES.get(port_code, f"type_{port_code}"),
        port_type_code=port_code,
        flr=bool(devcap & (1 << 28)),
        max_payload_supported=128 << (devcap & 0x7) if devcap & 0x7 <= 5 else 0,
        link_cap_speed_gts=None if lnkcap is None else LINK_SPEEDS_GTS.get(lnkcap & 0xF),
        link_cap_width=None if lnkcap is None else (lnkcap >> 4) & 0x3F,
        link_status_speed_gts=None if lnksta is None else LINK_SPEEDS_GTS.get(lnksta & 0xF),
        link_status_width=None if lnksta is None else (lnksta >> 4) & 0x3F,
        dll_link_active=bool(lnksta and lnksta & (1 << 13)),
        dll_link_active_reporting=bool(lnkcap and lnkcap & (1 << 20)),
        slot_implemented=slot_implemented,
        slot_caps=slot_caps,
        slot_control=slot_control,
        slot_status=slot_status,
    )


def _parse_msi(r: _Reader, cap: Capability | None) -> MsiInfo | None:
    if cap is None:
        return None
    ctrl = r.u16(cap.offset + 2) or 0
    return MsiInfo(
        enabled=bool(ctrl & 0x1),
        vectors=1 << min((ctrl >> 1) & 0x7, 5),
        vectors_enabled=1 << min((ctrl >> 4) & 0x7, 5),
        is_64bit=bool(ctrl & 0x80),
        per_vector_masking=bool(ctrl & 0x100),
    )


def _parse_msix(r: _Reader, cap: Capability | None) -> MsixInfo | None:
    if cap is None:
        return None
    ctrl = r.u16(cap.offset + 2) or 0
    table = r.u32(cap.offset + 4) or 0
    pba = r.u32(cap.offset + 8) or 0
    return MsixInfo(
        enabled=bool(ctrl & 0x8000),
        table_size=(ctrl & 0x7FF) + 1,
        function_mask=bool(ctrl & 0x4000),
        table_bar=table & 0x7,
        table_offset=table & ~0x7,
        pba_bar=pba & 0x7,
        pba_offset=pba & ~0x7,
    )


def _parse_dsn(r: _Reader, cap: Capability | None) -> str | None:
    if cap is None:
        return None
    low, high = r.u32(cap.offset + 4), r.u32(cap.offset + 8)
    if low is None or high is None:
        return None
    return "-".join(f"{b:02x}" for b in ((high << 32) | low).to_bytes(8, "big"))
