"""Device models as data: load a model TOML file and refuse impossible layouts.

A model file (emulators/models/<name>.toml) gives the identity a guest sees
(IDs, class, revision, subsystem), the BAR layout, where each capability sits
in configuration space, the PCIe link the card is capable of, its firmware
(and, for FPGAs, shell) version, its command queue and the Linux driver the lab's
stack would bind to it (`guest_driver`, bound in the emulated guest: guest_driver.py).
Every error names the file and the field, so a bad model never reaches QEMU.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..toml_file import read_toml
from .driver_table import guest_drivers

MODEL_DIR = Path(__file__).resolve().parent.parent / "models"
BAR_KINDS = ("mem32", "mem64")
BAR_BACKINGS = ("registers", "memfd")
MIN_BAR_SIZE = 4096  # a page: memfd BARs are mapped, the register BAR is page-granular too
SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class ModelError(BadInput):
    """A device model file is unknown or describes an impossible device (names file and field)."""


@cache
def pci_tables() -> dict:
    text = resources.files(__package__).joinpath("pci_tables.toml").read_text()
    return tomllib.loads(text)


@dataclass(frozen=True)
class Bar:
    index: int
    size: int
    kind: str  # mem32 | mem64
    prefetchable: bool
    backing: str  # registers | memfd

    @property
    def slots(self) -> tuple[int, ...]:
        """BAR registers this BAR occupies (a 64-bit BAR takes two)."""
        return (self.index, self.index + 1) if self.kind == "mem64" else (self.index,)


@dataclass(frozen=True)
class Capability:
    name: str
    offset: int
    cap_id: int
    size: int
    extended: bool
    version: int = 0


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> Version:
        match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
        if not match:
            raise ValueError(f"{text!r} is not MAJOR.MINOR.PATCH")
        major, minor, patch = (int(g) for g in match.groups())
        if major > 0xFFFF or minor > 0xFF or patch > 0xFF:
            raise ValueError(f"{text!r}: major must be < 65536, minor and patch < 256")
        return cls(major, minor, patch)

    @property
    def register(self) -> int:
        return self.major << 16 | self.minor << 8 | self.patch

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True)
class DeviceModel:
    name: str
    description: str
    source: Path
    vendor: int
    device: int
    class_code: int  # base class << 8 | subclass
    prog_if: int
    revision: int
    subsystem_vendor: int
    subsystem_device: int
    serial_number: int
    bars: tuple[Bar, ...]
    capabilities: tuple[Capability, ...]
    link_speed: str
    link_width: int
    firmware: Version
    shell: Version | None  # FPGA: a programmed shell that survives a guest reboot
    queue_depth: int
    queue_service_us: int
    guest_driver: str | None = None  # the Linux driver the lab's stack binds (guest_drivers.toml)

    @property
    def ids(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"

    @property
    def class_hex(self) -> str:
        return f"{self.class_code:04x}"

    def capability(self, name: str) -> Capability | None:
        return next((c for c in self.capabilities if c.name == name), None)

    def bar(self, index: int) -> Bar | None:
        return next((b for b in self.bars if b.index == index), None)

    @property
    def register_bar(self) -> Bar:
        return next(b for b in self.bars if b.backing == "registers")


def window_reserve(model: DeviceModel) -> dict[str, int]:
    """Root-port window reserves (QEMU `mem-reserve`, `pref64-reserve`) that fit the model's BARs.

    A hot-added card gets only what its port reserved; each window is the next power of two
    at or above the sum of the BARs that go in it (at least 1 MiB for memory).
    """
    mem = sum(b.size for b in model.bars if not (b.kind == "mem64" and b.prefetchable))
    pref64 = sum(b.size for b in model.bars if b.kind == "mem64" and b.prefetchable)
    reserve = {"mem-reserve": max(1 << 20, 1 << (mem - 1).bit_length())}
    if pref64:
        reserve["pref64-reserve"] = 1 << (pref64 - 1).bit_length()
    return reserve


def available_models() -> list[str]:
    return sorted(p.stem for p in MODEL_DIR.glob("*.toml") if p.stem != "registers")


def load_model(name_or_path: str | Path) -> DeviceModel:
    """A model by name (``a100-sxm4``) or by path to its TOML file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = MODEL_DIR / f"{name_or_path}.toml"
        if not path.exists():
            known = ", ".join(available_models())
            raise ModelError(f"unknown device model {str(name_or_path)!r} (known: {known})")
    table = read_toml(path, ModelError, "device model")
    return _ModelReader(path, table).read()


def parse_size(text: str | int) -> int:
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size like 16M or 4K")
    return int(match.group(1)) * SIZE_SUFFIXES.get(match.group(2), 1)


class _ModelReader:
    """Reads one parsed model table, raising ModelError with file and field."""

    def __init__(self, path: Path, table: dict[str, Any]):
        self.path = path
        self.table = table
        self.tables = pci_tables()

    def fail(self, field: str, problem: str) -> ModelError:
        return ModelError(f"{self.path}: field {field!r}: {problem}")

    def get(self, table: dict, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
        full = f"{where}.{key}" if where else key
        if key not in table:
            if default is ...:
                raise self.fail(full, "missing")
            return default
        value = table[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(full, f"expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
        return value

    def hex_id(self, table: dict, key: str, where: str, digits: int = 4, default: Any = ...) -> int:
        text = self.get(table, key, str, where, default)
        if text is None:
            return 0
        if not re.fullmatch(rf"[0-9a-fA-F]{{{digits}}}", text):
            raise self.fail(f"{where}.{key}", f"{text!r} is not {digits} hex digits")
        return int(text, 16)

    def version(self, table: dict, key: str, where: str) -> Version:
        try:
            return Version.parse(self.get(table, key, str, where))
        except ValueError as exc:
            raise self.fail(f"{where}.{key}", str(exc)) from None

    def read(self) -> DeviceModel:
        ident = self.get(self.table, "identity", dict, "")
        class_hex = self.get(ident, "class", str, "identity").lower()
        if class_hex not in self.tables["classes"]:
            known = ", ".join(f"{k} ({v})" for k, v in self.tables["classes"].items())
            raise self.fail("identity.class", f"unknown class {class_hex!r} (known: {known})")
        firmware = self.get(self.table, "firmware", dict, "")
        shell = self.get(self.table, "shell", dict, "", None)
        queue = self.get(self.table, "queue", dict, "")
        bars = self.read_bars()
        caps = self.read_capabilities()
        speed, width = self.read_link()
        revision = self.get(ident, "revision", int, "identity", 0)
        if not 0 <= revision <= 0xFF:
            raise self.fail("identity.revision", "must be 0..255")
        depth = self.get(queue, "depth", int, "queue")
        if not 1 <= depth <= 0xFFFF:
            raise self.fail("queue.depth", "must be 1..65535")
        service_us = self.get(queue, "service_us", int, "queue")
        if service_us < 0:
            raise self.fail("queue.service_us", "must be >= 0")
        serial = self.get(ident, "serial_number", int, "identity", 0)
        if not 0 <= serial < 1 << 64:
            raise self.fail("identity.serial_number", "must fit in 64 bits")
        return DeviceModel(
            name=self.get(self.table, "name", str, ""),
            description=self.get(self.table, "description", str, "", ""),
            source=self.path,
            vendor=self.hex_id(ident, "vendor", "identity"),
            device=self.hex_id(ident, "device", "identity"),
            class_code=int(class_hex, 16),
            prog_if=self.get(ident, "prog_if", int, "identity", 0),
            revision=revision,
            subsystem_vendor=self.hex_id(ident, "subsystem_vendor", "identity", default=None),
            subsystem_device=self.hex_id(ident, "subsystem_device", "identity", default=None),
            serial_number=serial,
            bars=bars,
            capabilities=caps,
            link_speed=speed,
            link_width=width,
            firmware=self.version(firmware, "version", "firmware"),
            shell=self.version(shell, "version", "shell") if shell is not None else None,
            queue_depth=depth,
            queue_service_us=service_us,
            guest_driver=self.read_guest_driver(),
        )

    def read_guest_driver(self) -> str | None:
        name = self.get(self.table, "guest_driver", str, "", None)
        if name is not None and name not in guest_drivers():
            raise self.fail("guest_driver", f"unknown guest driver {name!r} "
                                            f"(known: {', '.join(sorted(guest_drivers()))})")
        return name

    def read_bars(self) -> tuple[Bar, ...]:
        raw_bars = self.get(self.table, "bars", list, "")
        bars: list[Bar] = []
        taken: dict[int, str] = {}
        for i, raw in enumerate(raw_bars):
            where = f"bars[{i}]"
            if not isinstance(raw, dict):
                raise self.fail(where, "expected a table")
            index = self.get(raw, "index", int, where)
            if not 0 <= index <= 5:
                raise self.fail(f"{where}.index", "must be 0..5")
            try:
                size = parse_size(self.get(raw, "size", (str, int), where))
            except ValueError as exc:
                raise self.fail(f"{where}.size", str(exc)) from None
            if size < MIN_BAR_SIZE or size & (size - 1):
                raise self.fail(f"{where}.size", f"{size} is not a power of two >= {MIN_BAR_SIZE}")
            kind = self.get(raw, "kind", str, where)
            if kind not in BAR_KINDS:
                raise self.fail(f"{where}.kind", f"{kind!r} is not one of {BAR_KINDS}")
            if kind == "mem32" and size > 1 << 30:
                raise self.fail(f"{where}.size", "a 32-bit BAR larger than 1 GiB cannot be placed")
            backing = self.get(raw, "backing", str, where)
            if backing not in BAR_BACKINGS:
                raise self.fail(f"{where}.backing", f"{backing!r} is not one of {BAR_BACKINGS}")
            bar = Bar(index, size, kind, self.get(raw, "prefetchable", bool, where, False), backing)
            if kind == "mem64" and index == 5:
                raise self.fail(f"{where}.index", "a 64-bit BAR needs two BAR registers; 5 is the last")
            for slot in bar.slots:
                if slot in taken:
                    raise self.fail(f"{where}.index", f"BAR register {slot} is already used by {taken[slot]}")
                taken[slot] = where
            bars.append(bar)
        registers = [b for b in bars if b.backing == "registers"]
        if len(registers) != 1 or registers[0].index != 0:
            raise self.fail("bars", "exactly one BAR, BAR 0, must have backing = \"registers\"")
        return tuple(sorted(bars, key=lambda b: b.index))

    def read_capabilities(self) -> tuple[Capability, ...]:
        raw = self.get(self.table, "capabilities", dict, "")
        known = self.tables["capabilities"]
        caps = []
        for name, offset in raw.items():
            where = f"capabilities.{name}"
            if name not in known:
                raise self.fail(where, f"unknown capability (known: {', '.join(known)})")
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise self.fail(where, "expected an offset (int)")
            spec = known[name]
            extended = spec["space"] == "extended"
            low, high = (0x100, 0x1000) if extended else (0x40, 0x100)
            if offset % 4 or not low <= offset or offset + spec["size"] > high:
                raise self.fail(where, f"offset 0x{offset:x} must be dword-aligned and the "
                                       f"{spec['size']}-byte capability must fit in 0x{low:x}-0x{high:x}")
            caps.append(Capability(name, offset, spec["id"], spec["size"], extended, spec.get("version", 0)))
        caps.sort(key=lambda c: c.offset)
        for before, after in zip(caps, caps[1:], strict=False):
            if before.offset + before.size > after.offset:
                raise self.fail(f"capabilities.{after.name}",
                                f"0x{after.offset:x} overlaps capabilities.{before.name} "
                                f"(0x{before.offset:x}-0x{before.offset + before.size - 1:x})")
        if not any(c.name == "pcie" for c in caps):
            raise self.fail("capabilities.pcie", "missing (every model is a PCI Express endpoint)")
        extended = [c for c in caps if c.extended]
        if extended and extended[0].offset != 0x100:
            raise self.fail(f"capabilities.{extended[0].name}",
                            "the first extended capability must sit at 0x100")
        return tuple(caps)

    def read_link(self) -> tuple[str, int]:
        link = self.get(self.table, "link", dict, "")
        speed = self.get(link, "speed", str, "link")
        if speed not in self.tables["link_speeds"]:
            raise self.fail("link.speed", f"{speed!r} is not one of {tuple(self.tables['link_speeds'])}")
        width = self.get(link, "width", int, "link")
        if width not in self.tables["link"]["widths"]:
            raise self.fail("link.width", f"{width} is not one of {self.tables['link']['widths']}")
        return speed, width
