"""A model's 4 KiB PCI Express configuration space, built from its data.

Holds the bytes, which bits a guest may write, which are write-1-to-clear,
and the few side effects hardware has: BAR sizing, Function Level Reset
requested through Device Control, link status that a fault can retrain.
Writes to places with no register (e.g. the 0x488 NVIDIA HDA quirk) are
dropped, as on a real card.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .model import DeviceModel, pci_tables

SIZE = 4096
COMMAND = 0x04
STATUS = 0x06
STATUS_CAP_LIST = 0x0010
COMMAND_WRITABLE = 0x0547  # I/O, memory, bus master, parity, SERR#, INTx disable
BAR0 = 0x10
SUBSYSTEM = 0x2C
CAP_PTR = 0x34
INTERRUPT_LINE = 0x3C

# Offsets inside the PCI Express capability.
EXP_FLAGS = 0x02
EXP_DEVCAP = 0x04
EXP_DEVCTL = 0x08
EXP_DEVSTA = 0x0A
EXP_LNKCAP = 0x0C
EXP_LNKCTL = 0x10
EXP_LNKSTA = 0x12
EXP_LNKCAP2 = 0x2C
EXP_LNKCTL2 = 0x30
DEVCAP_FLR = 1 << 28
DEVCAP_RBER = 1 << 15
DEVCAP_PAYLOAD_256 = 0x1
DEVCTL_BCR_FLR = 0x8000
DEVCTL_WRITABLE = 0x7CFF  # error reporting enables, payload, relaxed ordering, read request size

# Offsets inside AER and DSN.
AER_UNCOR_STATUS = 0x04
AER_UNCOR_MASK = 0x08
AER_UNCOR_SEVER = 0x0C
AER_COR_STATUS = 0x10
AER_COR_MASK = 0x14
AER_CAP_CTL = 0x18
AER_UNCOR_SEVER_DEFAULT = 0x00462030
AER_COR_MASK_DEFAULT = 0x00002000
AER_UNCOR_BITS = 0x03FFF030
AER_COR_BITS = 0x0000F1C1
DSN_SERIAL = 0x04


class ConfigSpace:
    def __init__(self, model: DeviceModel, serial_number: int | None = None,
                 on_flr: Callable[[], None] | None = None):
        self.model = model
        self.serial_number = model.serial_number if serial_number is None else serial_number
        self.on_flr = on_flr
        self.data = bytearray(SIZE)
        self.writable = bytearray(SIZE)
        self.clear_on_write = bytearray(SIZE)  # RW1C bits
        self.pcie = model.capability("pcie").offset
        self.aer = model.capability("aer").offset if model.capability("aer") else None
        self.reset()

    # -- building ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Power-on / FLR state: everything from the model, nothing the guest wrote."""
        self.data[:] = bytes(SIZE)
        self.writable[:] = bytes(SIZE)
        self.clear_on_write[:] = bytes(SIZE)
        m = self.model
        self._put(0x00, "<HH", m.vendor, m.device)
        self._put(STATUS, "<H", STATUS_CAP_LIST)
        self._put(0x08, "<BBBB", m.revision, m.prog_if, m.class_code & 0xFF, m.class_code >> 8)
        self._put(SUBSYSTEM, "<HH", m.subsystem_vendor, m.subsystem_device)
        self._mask(COMMAND, 2, COMMAND_WRITABLE)
        self._mask(INTERRUPT_LINE, 1, 0xFF)
        for bar in m.bars:
            self._build_bar(bar)
        standard = [c for c in m.capabilities if not c.extended]
        extended = [c for c in m.capabilities if c.extended]
        if standard:
            self.data[CAP_PTR] = standard[0].offset
        for cap, nxt in zip(standard, [*standard[1:], None], strict=True):
            self.data[cap.offset] = cap.cap_id
            self.data[cap.offset + 1] = nxt.offset if nxt else 0
            getattr(self, f"_build_{cap.name}")(cap.offset)
        for cap, nxt in zip(extended, [*extended[1:], None], strict=True):
            header = cap.cap_id | cap.version << 16 | (nxt.offset if nxt else 0) << 20
            self._put(cap.offset, "<I", header)
            getattr(self, f"_build_{cap.name}")(cap.offset)

    def _build_bar(self, bar) -> None:
        offset = BAR0 + 4 * bar.index
        low = (0x4 if bar.kind == "mem64" else 0) | (0x8 if bar.prefetchable else 0)
        self._put(offset, "<I", low)
        self._mask(offset, 4, ~(bar.size - 1) & 0xFFFFFFF0)
        if bar.kind == "mem64":
            self._mask(offset + 4, 4, (~(bar.size - 1) >> 32) & 0xFFFFFFFF)

    def _build_pm(self, at: int) -> None:
        self._put(at + 2, "<H", 0x0003)  # PM spec 1.2, no PME
        self._put(at + 4, "<H", 0x0008)  # PMCSR: No_Soft_Reset, D0
        self._mask(at + 4, 2, 0x0003)    # power state

    def _build_pcie(self, at: int) -> None:
        speed_code = pci_tables()["link_speeds"][self.model.link_speed]
        self._put(at + EXP_FLAGS, "<H", 0x0002)  # version 2, PCI Express endpoint
        self._put(at + EXP_DEVCAP, "<I", DEVCAP_FLR | DEVCAP_RBER | DEVCAP_PAYLOAD_256)
        self._put(at + EXP_DEVCTL, "<H", 0x2810)  # relaxed ordering, 512 B read requests
        self._mask(at + EXP_DEVCTL, 2, DEVCTL_WRITABLE | DEVCTL_BCR_FLR)
        self._mask(at + EXP_DEVSTA, 2, 0x000F, clear_on_write=True)
        self._put(at + EXP_LNKCAP, "<I", speed_code | self.model.link_width << 4)
        self._mask(at + EXP_LNKCTL, 2, 0x01C3)
        self.set_link(self.model.link_speed, self.model.link_width)
        self._put(at + EXP_LNKCAP2, "<I", ((1 << (speed_code + 1)) - 2))  # supported speeds vector
        self._put(at + EXP_LNKCTL2, "<H", speed_code)
        self._mask(at + EXP_LNKCTL2, 2, 0x000F)

    def _build_aer(self, at: int) -> None:
        self._mask(at + AER_UNCOR_STATUS, 4, AER_UNCOR_BITS, clear_on_write=True)
        self._mask(at + AER_UNCOR_MASK, 4, AER_UNCOR_BITS)
        self._put(at + AER_UNCOR_SEVER, "<I", AER_UNCOR_SEVER_DEFAULT)
        self._mask(at + AER_UNCOR_SEVER, 4, AER_UNCOR_BITS)
        self._mask(at + AER_COR_STATUS, 4, AER_COR_BITS, clear_on_write=True)
        self._put(at + AER_COR_MASK, "<I", AER_COR_MASK_DEFAULT)
        self._mask(at + AER_COR_MASK, 4, AER_COR_BITS)
        self._mask(at + AER_CAP_CTL, 4, 0x00000140)  # ECRC generation/check enables

    def _build_dsn(self, at: int) -> None:
        self._put(at + DSN_SERIAL, "<Q", self.serial_number)

    def _put(self, offset: int, fmt: str, *values: int) -> None:
        struct.pack_into(fmt, self.data, offset, *values)

    def _mask(self, offset: int, size: int, bits: int, clear_on_write: bool = False) -> None:
        target = self.clear_on_write if clear_on_write else self.writable
        target[offset:offset + size] = (bits & ((1 << (8 * size)) - 1)).to_bytes(size, "little")

    # -- state a fault or the guest changes -------------------------------------------------------
    def set_link(self, speed: str, width: int) -> None:
        """Link Status as trained: speed name (e.g. "8") and negotiated width."""
        speed_code = pci_tables()["link_speeds"][speed]
        self._put(self.pcie + EXP_LNKSTA, "<H", speed_code | width << 4)

    def link_status(self) -> tuple[int, int]:
        """(speed code, width) from Link Status."""
        value = self.read16(self.pcie + EXP_LNKSTA)
        return value & 0xF, (value >> 4) & 0x3F

    @property
    def memory_decoding(self) -> bool:
        """Command register Memory Space bit: off, the card answers no BAR access."""
        return bool(self.read16(COMMAND) & 0x2)

    def clear_bars(self) -> None:
        """Configuration lost: BAR addresses and the command register back to zero."""
        for bar in self.model.bars:
            offset = BAR0 + 4 * bar.index
            low = struct.unpack_from("<I", self.data, offset)[0] & 0xF
            self._put(offset, "<I", low)
            if bar.kind == "mem64":
                self._put(offset + 4, "<I", 0)
        self._put(COMMAND, "<H", 0)

    def set_aer_status(self, uncorrectable: int = 0, correctable: int = 0) -> None:
        if self.aer is None:
            return
        at = self.aer
        self._put(at + AER_UNCOR_STATUS, "<I", self.read32(at + AER_UNCOR_STATUS) | uncorrectable)
        self._put(at + AER_COR_STATUS, "<I", self.read32(at + AER_COR_STATUS) | correctable)

    # -- access ---------------------------------------------------------------------------------
    def read(self, offset: int, count: int) -> bytes:
        if offset < 0 or offset + count > SIZE:
            raise ValueError(f"config read 0x{offset:x}+{count} outside 4 KiB")
        return bytes(self.data[offset:offset + count])

    def read16(self, offset: int) -> int:
        return struct.unpack_from("<H", self.data, offset)[0]

    def read32(self, offset: int) -> int:
        return struct.unpack_from("<I", self.data, offset)[0]

    def write(self, offset: int, data: bytes) -> None:
        if offset < 0 or offset + len(data) > SIZE:
            raise ValueError(f"config write 0x{offset:x}+{len(data)} outside 4 KiB")
        devctl = self.pcie + EXP_DEVCTL
        flr = offset <= devctl + 1 < offset + len(data) and data[devctl + 1 - offset] & 0x80
        for i, byte in enumerate(data):
            at = offset + i
            keep = self.data[at] & ~self.writable[at]
            value = keep | (byte & self.writable[at])
            value &= ~(byte & self.clear_on_write[at])
            self.data[at] = value & 0xFF
        self.data[devctl + 1] &= 0x7F  # Initiate FLR always reads 0
        if flr and self.on_flr is not None:
            self.on_flr()
