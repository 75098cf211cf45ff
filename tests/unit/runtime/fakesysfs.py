"""Fake sysfs trees in a temporary folder, and hand-built config space.

Used by the runtime's unit tests (discovery and the hot-add/hot-remove
procedures). The layout mimics the kernel's: device folders under
sys/devices/pci0000:00/..., links in sys/bus/pci/devices, driver links,
slots in sys/bus/pci/slots, nvme namespaces with ``inflight``.

    fake = FakeSysfs(tmp_path)
    fake.add_device("0000:01:00.0", config=nvme_config(), driver="nvme", slot="1",
                    resource=[mem_bar(0xfe000000, 0x4000)], nvme_inflight=(0, 0),
                    nvme_serial="SN1", reset_method="flr bus", aer=True)
    sysfs = fake.sysfs
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from hilconform.runtime.pciconfig import parse_config
from hilconform.runtime.sysfs import Sysfs

IORESOURCE_IO = 0x100
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000

AER_NAMES = {
    "correctable": [
        "RxErr",
        "BadTLP",
        "BadDLLP",
        "Rollover",
        "Timeout",
        "NonFatalErr",
        "CorrIntErr",
        "HeaderOF",
    ],
    "nonfatal": [
        "Undefined",
        "DLP",
        "SDES",
        "TLP",
        "FCP",
        "CmpltTO",
        "CmpltAbrt",
        "UnxCmplt",
        "RxOF",
        "MalfTLP",
        "ECRC",
        "UnsupReq",
        "ACSViol",
        "UncorrIntErr",
        "BlockedTLP",
        "AtomicOpBlocked",
        "TLPBlockedErr",
        "PoisonTLPBlocked",
    ],
}
AER_NAMES["fatal"] = AER_NAMES["nonfatal"]
AER_TOTALS = {
    "correctable": "TOTAL_ERR_COR",
    "nonfatal": "TOTAL_ERR_NONFATAL",
    "fatal": "TOTAL_ERR_FATAL",
}


# --- config space ---------------------------------------------------------
class ConfigBuilder:
    """Builds config-space bytes; capabilities are chained in the order added."""

    def __init__(
        self,
        vendor: int = 0x1B36,
        device: int = 0x0010,
        class_code: int = 0x010802,
        revision: int = 0x02,
        subsystem: tuple[int, int] = (0x1AF4, 0x1100),
        header_type: int = 0,
        command: int = 0x0006,
        size: int = 4096,
    ):
        self.buf = bytearray(size)
        struct.pack_into("<HHHH", self.buf, 0, vendor, device, command, 0)
        self.buf[8] = revision
        self.buf[9:12] = class_code.to_bytes(3, "little")
        self.buf[0x0E] = header_type
        if header_type == 0:
            struct.pack_into("<HH", self.buf, 0x2C, *subsystem)
        self._last_cap: int | None = None
        self._next_cap = 0x40
        self._last_ext: int | None = None
        self._next_ext = 0x100

    def u8(self, off: int, v: int) -> ConfigBuilder:
        self.buf[off] = v
        return self

    def u16(self, off: int, v: int) -> ConfigBuilder:
        struct.pack_into("<H", self.buf, off, v)
        return self

    def u32(self, off: int, v: int) -> ConfigBuilder:
        struct.pack_into("<I", self.buf, off, v)
        return self

    def bar(self, index: int, value: int) -> ConfigBuilder:
        return self.u32(0x10 + 4 * index, value)

    def cap(self, cap_id: int, body: bytes = b"", length: int | None = None) -> int:
        """Append a standard capability (2-byte header + body); returns its offset."""
        off = self._next_cap
        size = max(length or 0, 2 + len(body))
        self.buf[off] = cap_id
        self.buf[off + 1] = 0
        self.buf[off + 2 : off + 2 + len(body)] = body
        if self._last_cap is None:
            self.buf[0x34] = off
            self.buf[0x06] |= 0x10  # Status: Capabilities List
        else:
            self.buf[self._last_cap + 1] = off
        self._last_cap = off
        self._next_cap = off + ((size + 3) & ~3)
        return off

    def ext_cap(self, cap_id: int, body: bytes = b"", version: int = 1) -> int:
        """Append an extended capability (4-byte header + body); returns its offset."""
        off = self._next_ext
        self.u32(off, cap_id | version << 16)
        self.buf[off + 4 : off + 4 + len(body)] = body
        if self._last_ext is not None:
            header = struct.unpack_from("<I", self.buf, self._last_ext)[0]
            self.u32(self._last_ext, (header & 0xFFFFF) | off << 20)
        self._last_ext = off
        self._next_ext = off + ((4 + len(body) + 3) & ~3)
        return off

    def pm(self, state: int = 0) -> int:
        return self.cap(0x01, struct.pack("<HHBB", 0x0003, state & 3, 0, 0))

    def msi(
        self,
        enabled: bool = False,
        vectors_log2: int = 0,
        enabled_log2: int = 0,
        is_64bit: bool = True,
    ) -> int:
        ctrl = int(enabled) | vectors_log2 << 1 | enabled_log2 << 4 | int(is_64bit) << 7
        return self.cap(0x05, struct.pack("<H", ctrl), length=24)

    def msix(
        self,
        table_size: int,
        enabled: bool = False,
        table_bar: int = 0,
        table_offset: int = 0x2000,
        pba_bar: int = 0,
        pba_offset: int = 0x3000,
    ) -> int:
        ctrl = (table_size - 1) | int(enabled) << 15
        return self.cap(0x11, struct.pack("<HII", ctrl, table_offset | table_bar, pba_offset | pba_bar))

    def pcie(
        self,
        port_type: int = 0,
        flr: bool = False,
        link_cap: tuple[int, int] = (1, 1),
        link_status: tuple[int, int] = (1, 1),
        dll_active: bool = False,
        dll_reporting: bool = False,
        slot: dict | None = None,
        version: int = 2,
    ) -> int:
        """PCI Express capability. link_* = (speed code 1=2.5 GT/s..., width).
        ``slot`` = {"number", "hot_plug_capable", "presence", "power_off", ...} adds a slot."""
        flags = version | port_type << 4 | (0x100 if slot is not None else 0)
        devcap = 0x1 | (1 << 28 if flr else 0)
        lnkcap = link_cap[0] | link_cap[1] << 4 | (1 << 20 if dll_reporting else 0)
        lnksta = link_status[0] | link_status[1] << 4 | (1 << 13 if dll_active else 0)
        sltcap = sltctl = sltsta = 0
        if slot is not None:
            sltcap = (
                int(slot.get("attention_button", True))
                | int(slot.get("power_controller", True)) << 1
                | int(slot.get("hot_plug_capable", True)) << 6
                | slot.get("number", 0) << 19
            )
            sltctl = int(slot.get("power_off", False)) << 10 | 0x20
            sltsta = int(slot.get("presence", True)) << 6 | int(slot.get("button_pressed", False))
        body = struct.pack("<HIHHIHHIHH", flags, devcap, 0, 0, lnkcap, 0, lnksta, sltcap, sltctl, sltsta)
        return self.cap(0x10, body, length=0x3C)

    def aer(self) -> int:
        return self.ext_cap(0x0001, bytes(0x44), version=2)

    def dsn(self, serial: int) -> int:
        return self.ext_cap(0x0003, struct.pack("<Q", serial))

    def build(self) -> bytes:
        return bytes(self.buf)


def nvme_config(
    serial: int | None = None, link: tuple[int, int] = (1, 1), msix_enabled: bool = True
) -> bytes:
    """Config like QEMU's nvme (1b36:0010) with its driver bound: PM, MSI-X, PCIe endpoint
    with FLR, link (speed code, width); a DSN if ``serial`` (QEMU's nvme has none)."""
    b = ConfigBuilder(command=0x0406)
    b.bar(0, 0xFE000004)
    b.pm()
    b.msix(65, enabled=msix_enabled)
    b.pcie(port_type=0, flr=True, link_cap=link, link_status=link)
    if serial is not None:
        b.dsn(serial)
    return b.build()


def edu_config() -> bytes:
    """Config like QEMU's edu (1234:11e8): conventional endpoint with MSI, no driver."""
    b = ConfigBuilder(
        vendor=0x1234, device=0x11E8, class_code=0x00FF00, revision=0x10, subsystem=(0x1AF4, 0x1100)
    )
    b.bar(0, 0xFEA00000)
    b.msi()
    return b.build()


def root_port_config(
    slot_number: int = 1, dll_active: bool = True, link_cap: tuple[int, int] = (4, 16)
) -> bytes:
    """Config like QEMU's pcie-root-port (1b36:000c): bridge header, hot-plug slot, AER."""
    b = ConfigBuilder(vendor=0x1B36, device=0x000C, class_code=0x060400, revision=0, header_type=1)
    b.pcie(
        port_type=4,
        link_cap=link_cap,
        link_status=(1, 1) if dll_active else (1, 0),
        dll_active=dll_active,
        dll_reporting=True,
        slot={"number": slot_number},
    )
    b.msix(1)
    b.aer()
    return b.build()


def mem_bar(start: int, size: int, mem64: bool = True, prefetch: bool = False) -> tuple[int, int, int]:
    """One ``resource`` line for a memory BAR."""
    flags = IORESOURCE_MEM | (IORESOURCE_MEM_64 if mem64 else 0) | (IORESOURCE_PREFETCH if prefetch else 0)
    return (start, start + size - 1, flags)


def io_bar(start: int, size: int) -> tuple[int, int, int]:
    return (start, start + size - 1, IORESOURCE_IO)


# --- the tree -----------------------------------------------------------------
class FakeSysfs:
    """A sysfs tree under ``tmp_path``; ``.sysfs`` is a runtime Sysfs rooted there."""

    def __init__(self, tmp_path: str | os.PathLike):
        self.root = Path(tmp_path)
        self.sys = self.root / "sys"
        for sub in ("bus/pci/devices", "bus/pci/slots", "bus/pci/drivers", "devices/pci0000:00"):
            (self.sys / sub).mkdir(parents=True, exist_ok=True)
        self._nvme_count = 0

    @property
    def sysfs(self) -> Sysfs:
        return Sysfs(str(self.root))

    def device_dir(self, bdf: str) -> Path:
        return Path(os.path.realpath(self.sys / "bus/pci/devices" / bdf))

    def add_device(
        self,
        bdf: str,
        config: bytes | None = None,
        *,
        driver: str | None = None,
        resource: list[tuple[int, int, int]] | None = None,
        mmio: dict[int, bytes] | None = None,
        slot: str | None = None,
        parent: str | None = None,
        nvme_inflight: tuple[int, int] | None = None,
        nvme_serial: str | None = None,
        nvme_firmware: str | None = None,
        reset_method: str | list[str] | None = None,
        aer: bool | dict[str, dict[str, int]] = False,
        numa_node: int = -1,
        msi_irqs: tuple[int, ...] = (),
    ) -> Path:
        """Add a PCI function; returns its device folder.

        ``config`` defaults to an nvme-like one. ``resource``: lines from
        mem_bar()/io_bar(); each memory BAR gets a resourceN file holding
        ``mmio[N]`` (default 4 KiB of zeros). ``nvme_*`` create nvme/nvmeK
        (and a namespace with ``inflight`` when nvme_inflight is given).
        ``aer``: True for zeroed aer_dev_* files, or {category: {name: n}}.
        """
        config = nvme_config() if config is None else config
        parent_dir = self.device_dir(parent) if parent else self.sys / "devices/pci0000:00"
        dev = parent_dir / bdf
        dev.mkdir(parents=True)
        link = self.sys / "bus/pci/devices" / bdf
        link.symlink_to(os.path.relpath(dev, link.parent))
        (dev / "config").write_bytes(config)
        self._write_ids(dev, config)
        lines = list(resource or [])
        text = "".join(
            f"0x{s:016x} 0x{e:016x} 0x{f:016x}\n" for s, e, f in lines + [(0, 0, 0)] * (13 - len(lines))
        )
        (dev / "resource").write_text(text)
        for index, (start, end, flags) in enumerate(lines[:6]):
            if flags & (IORESOURCE_MEM | IORESOURCE_IO) and end > start:
                (dev / f"resource{index}").write_bytes((mmio or {}).get(index, bytes(4096)))
        for name, value in (("numa_node", str(numa_node)), ("enable", "1"), ("irq", "10")):
            (dev / name).write_text(value + "\n")
        for name in ("remove", "rescan", "uevent"):
            (dev / name).write_text("")
        (dev / "msi_irqs").mkdir()
        for irq in msi_irqs:
            (dev / "msi_irqs" / str(irq)).write_text("msix\n")
        if reset_method is not None:
            methods = reset_method if isinstance(reset_method, str) else " ".join(reset_method)
            (dev / "reset_method").write_text(methods + "\n")
            (dev / "reset").write_text("")
        if aer:
            self._write_aer(dev, aer if isinstance(aer, dict) else {})
        if driver:
            self.set_driver(bdf, driver)
        if slot is not None:
            self.add_slot(slot, bdf.rsplit(".", 1)[0])
        if nvme_inflight is not None or nvme_serial is not None or nvme_firmware is not None:
            self._add_nvme(dev, nvme_inflight, nvme_serial, nvme_firmware)
        return dev

    def _write_ids(self, dev: Path, config: bytes) -> None:
        try:
            cfg = parse_config(config)
        except ValueError:
            return
        if not cfg.present:
            return
        for name, value, digits in (
            ("vendor", cfg.vendor_id, 4),
            ("device", cfg.device_id, 4),
            ("subsystem_vendor", cfg.subsystem_vendor_id or 0, 4),
            ("subsystem_device", cfg.subsystem_id or 0, 4),
            ("class", cfg.class_code, 6),
            ("revision", cfg.revision, 2),
        ):
            (dev / name).write_text(f"0x{value:0{digits}x}\n")

    def _add_nvme(self, dev: Path, inflight, serial, firmware) -> None:
        k = self._nvme_count
        self._nvme_count += 1
        ctrl = dev / "nvme" / f"nvme{k}"
        ctrl.mkdir(parents=True)
        (ctrl / "serial").write_text(f"{serial or ''}\n")
        (ctrl / "firmware_rev").write_text(f"{firmware or ''}\n")
        (ctrl / "model").write_text("QEMU NVMe Ctrl\n")
        if inflight is not None:
            ns = ctrl / f"nvme{k}n1"
            ns.mkdir()
            (ns / "dev").write_text(f"259:{k}\n")
            (ns / "inflight").write_text(f"{inflight[0]:8d} {inflight[1]:8d}\n")

    def _write_aer(self, dev: Path, counts: dict[str, dict[str, int]]) -> None:
        for category, names in AER_NAMES.items():
            given = counts.get(category, {})
            values = {n: given.get(n, 0) for n in names}
            values[AER_TOTALS[category]] = given.get(AER_TOTALS[category], sum(values.values()))
            (dev / f"aer_dev_{category}").write_text("".join(f"{n} {v}\n" for n, v in values.items()))

    # --- mutators ---------------------------------------------------------------
    def add_slot(self, name: str, address: str, power: bool = True) -> Path:
        slot = self.sys / "bus/pci/slots" / name
        slot.mkdir(parents=True, exist_ok=True)
        (slot / "address").write_text(address + "\n")
        (slot / "power").write_text(("1" if power else "0") + "\n")
        for attr in ("attention", "latch", "adapter"):
            (slot / attr).write_text("0\n" if attr != "adapter" else "1\n")
        return slot

    def slot_value(self, name: str, attr: str = "power") -> str:
        return (self.sys / "bus/pci/slots" / name / attr).read_text().strip()

    def set_driver(self, bdf: str, driver: str | None) -> None:
        link = self.device_dir(bdf) / "driver"
        if link.is_symlink():
            link.unlink()
        if driver:
            target = self.sys / "bus/pci/drivers" / driver
            target.mkdir(exist_ok=True)
            link.symlink_to(os.path.relpath(target, link.parent))

    def set_inflight(self, bdf: str, reads: int, writes: int) -> None:
        paths = list(self.device_dir(bdf).glob("nvme/nvme*/nvme*n*/inflight"))
        if not paths:
            raise FileNotFoundError(f"{bdf} has no nvme namespace (add it with nvme_inflight=)")
        paths[0].write_text(f"{reads:8d} {writes:8d}\n")

    def set_config(self, bdf: str, config: bytes) -> None:
        (self.device_dir(bdf) / "config").write_bytes(config)

    def lose_config(self, bdf: str, mmio_all_ones: bool = True) -> None:
        """Config (and BAR contents) read all ones, as after a surprise removal."""
        dev = self.device_dir(bdf)
        size = len((dev / "config").read_bytes())
        (dev / "config").write_bytes(b"\xff" * size)
        if mmio_all_ones:
            for res in dev.glob("resource[0-9]"):
                res.write_bytes(b"\xff" * max(len(res.read_bytes()), 4))

    def set_mmio(self, bdf: str, bar: int, data: bytes) -> None:
        (self.device_dir(bdf) / f"resource{bar}").write_bytes(data)

    def bump_aer(self, bdf: str, category: str, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` and to the category's TOTAL."""
        path = self.device_dir(bdf) / f"aer_dev_{category}"
        lines = [line.split() for line in path.read_text().splitlines()]
        total = AER_TOTALS[category]
        out = []
        for key, value in lines:
            out.append(f"{key} {int(value) + n if key in (name, total) else value}\n")
        path.write_text("".join(out))

    def set_attr(self, bdf: str, name: str, value: str) -> None:
        (self.device_dir(bdf) / name).write_text(value + "\n")

    def read_attr(self, bdf: str, name: str) -> str:
        """What is in devices/BDF/NAME (e.g. what the runtime wrote to ``reset``)."""
        return (self.device_dir(bdf) / name).read_text()

    def remove_device(self, bdf: str) -> None:
        """The device disappears (its folder, children included, and its bus link)."""
        dev = self.device_dir(bdf)
        (self.sys / "bus/pci/devices" / bdf).unlink()
        for child in [
            p.name
            for p in dev.iterdir()
            if p.is_dir() and (self.sys / "bus/pci/devices" / p.name).is_symlink()
        ]:
            (self.sys / "bus/pci/devices" / child).unlink()
        shutil.rmtree(dev)
