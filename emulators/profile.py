"""Host profiles: TOML data describing an emulated host's slots and budgets.

A profile names, per slot, the root port (chassis/slot, link caps), the stock
QEMU device standing in for an accelerator, the real device it stands in for,
and the host-wide hot-plug mode and budgets the suites apply. Loading checks
every key and names the file and the key when something is wrong.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import ProfileError
from .toml_file import read_toml
from .vfio_user.model import ModelError, load_model

PROFILE_DIR = Path(__file__).with_name("profiles")
PROFILE_PATH_ENV = "HILCONFORM_PROFILE_PATH"
HOTPLUG_MODES = ("native", "acpi")
LINK_SPEEDS = ("2_5", "5", "8", "16")
LINK_WIDTHS = ("1", "2", "4", "8", "12", "16", "32")
EMPTY = "empty"
# Root ports that fit on q35's pcie.0: device numbers 0x10-0x1e, eight functions each (qemu_command.py).
MAX_SLOTS = 120
MODEL_PREFIX = "model:"  # a slot device `model:a100-sxm4` is the device model emulators/models/a100-sxm4.toml


@dataclass(frozen=True)
class DeviceKind:
    """A stock QEMU device that can stand in for an accelerator."""

    name: str
    qemu_driver: str
    vendor: str
    device: str
    class_code: str
    queue: str
    disk_mib: int = 0

    @property
    def model(self) -> str | None:
        """The device model's name for a `model:<name>` kind (served over vfio-user), else None."""
        return self.name.removeprefix(MODEL_PREFIX) if self.name.startswith(MODEL_PREFIX) else None


@dataclass(frozen=True)
class StandsInFor:
    vendor: str
    device: str
    model: str


@dataclass(frozen=True)
class Slot:
    name: str
    chassis: int
    slot: int
    link_speed: str
    link_width: str
    device: str  # a DeviceKind name, or "empty"
    accepts: str  # the kind a hot-add puts here by default
    stands_in_for: StandsInFor
    firmware_version: str | None = None

    @property
    def port_id(self) -> str:
        """QEMU id of the root port above the slot."""
        return f"rp-{self.name}"

    @property
    def populated(self) -> bool:
        return self.device != EMPTY


@dataclass(frozen=True)
class HostProfile:
    name: str
    description: str
    source: Path
    memory_mib: int
    cpus: int
    hotplug_mode: str
    select_classes: tuple[str, ...]
    select_ids: tuple[str, ...]
    budgets: dict[str, float]
    slots: tuple[Slot, ...]
    kinds: dict[str, DeviceKind] = field(repr=False, default_factory=dict)

    def slot(self, name: str) -> Slot:
        for slot in self.slots:
            if slot.name == name:
                return slot
        known = ", ".join(s.name for s in self.slots)
        raise ProfileError(f"profile {self.name!r} has no slot {name!r} (slots: {known})")

    def kind(self, name: str) -> DeviceKind:
        try:
            return self.kinds[name]
        except KeyError:
            known = ", ".join(sorted(self.kinds))
            raise ProfileError(f"unknown device kind {name!r} (known: {known})") from None

    @property
    def uses_models(self) -> bool:
        """Whether any slot holds (or accepts) a device model, which needs the vfio-user QEMU."""
        return any(self.kinds[name].model for s in self.slots for name in (s.device, s.accepts)
                   if name in self.kinds)

    def with_hotplug_mode(self, mode: str) -> HostProfile:
        if mode not in HOTPLUG_MODES:
            raise ProfileError(f"unknown hot-plug mode {mode!r} (use one of {HOTPLUG_MODES})")
        fields = dict(self.__dict__, hotplug_mode=mode)
        return HostProfile(**fields)


def profile_dirs() -> list[Path]:
    """Where profiles are found: the folders of $HILCONFORM_PROFILE_PATH (a lab's own profiles,
    separated by ':'; each must exist), then emulators/profiles/. The first folder naming a profile wins."""
    extra = [Path(p) for p in os.environ.get(PROFILE_PATH_ENV, "").split(os.pathsep) if p]
    for folder in extra:
        if not folder.is_dir():
            raise ProfileError(f"${PROFILE_PATH_ENV} names {folder}: not a folder")
    return [*extra, PROFILE_DIR]


def _profile_paths() -> dict[str, Path]:
    """Profiles by name: device-model hosts (a100, t4, fpga, mixed) and their stock-device
    variants (a100-stock, ...) in emulators/profiles/, and a lab's own (profile_dirs)."""
    found: dict[str, Path] = {}
    for folder in profile_dirs():
        for path in sorted(folder.glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def available_profiles() -> list[str]:
    return sorted(_profile_paths())


def load_device_kinds() -> dict[str, DeviceKind]:
    text = resources.files(__package__).joinpath("device_kinds.toml").read_text()
    table = tomllib.loads(text)
    return {
        name: DeviceKind(
            name=name,
            qemu_driver=entry["qemu_driver"],
            vendor=entry["vendor"],
            device=entry["device"],
            class_code=entry["class"],
            queue=entry["queue"],
            disk_mib=int(entry.get("disk_mib", 0)),
        )
        for name, entry in table.items()
    }


def load_profile(name_or_path: str | Path) -> HostProfile:
    """Load a profile by name (``a100``) or by path to a TOML file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = _profile_paths().get(str(name_or_path), PROFILE_DIR / f"{name_or_path}.toml")
        if not path.exists():
            known = ", ".join(available_profiles())
            raise ProfileError(f"unknown host profile {str(name_or_path)!r} (known: {known})")
    table = read_toml(path, ProfileError, "host profile")
    return _ProfileReader(path, table).read()


# The tables and keys a profile may hold; anything else is refused with the file and key named.
_TOP_KEYS = {"host", "runtime", "budgets", "slots"}
_HOST_KEYS = {"name", "description", "memory_mib", "cpus", "hotplug_mode"}
_RUNTIME_KEYS = {"select_classes", "select_ids"}
_SLOT_KEYS = {"name", "chassis", "slot", "link", "device", "accepts", "stands_in_for", "firmware_version"}
_LINK_KEYS = {"speed", "width"}
_STANDS_IN_FOR_KEYS = {"vendor", "device", "model"}


@cache
def known_budgets() -> dict[str, dict]:
    """Budget name → {unit, meaning}: every budget a host profile may set (emulators/budgets.toml)."""
    table = read_toml(Path(__file__).with_name("budgets.toml"), ProfileError, "budget list")
    return table["budgets"]


def unknown_budget(names) -> tuple[str, str] | None:
    """(key, problem) for the first budget name that no profile may set, or None when all are known."""
    known = known_budgets()
    name = next((n for n in sorted(names) if n not in known), None)
    if name is None:
        return None
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"budgets.{name}", f"unknown budget ({hint}known: {', '.join(sorted(known))})"


class _ProfileReader:
    """Reads one parsed TOML table, raising ProfileError with file and key."""

    def __init__(self, path: Path, table: dict[str, Any]):
        self.path = path
        self.table = table
        self.kinds = load_device_kinds()

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(f"{self.path}: key {key!r}: {problem}")

    def get(self, table: dict, key: str, kind: type, where: str, default: Any = ...) -> Any:
        full = f"{where}.{key}" if where else key
        if key not in table:
            if default is ...:
                raise self.fail(full, "missing")
            return default
        value = table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(full, f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    def only(self, table: dict, where: str, allowed: set[str]) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            key = f"{where}.{unknown[0]}" if where else unknown[0]
            raise self.fail(key, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def read(self) -> HostProfile:
        self.only(self.table, "", _TOP_KEYS)
        host = self.get(self.table, "host", dict, "")
        runtime = self.get(self.table, "runtime", dict, "", {})
        budgets = self.get(self.table, "budgets", dict, "")
        slots_raw = self.get(self.table, "slots", list, "")
        self.only(host, "host", _HOST_KEYS)
        self.only(runtime, "runtime", _RUNTIME_KEYS)
        misspelt = unknown_budget(budgets)
        if misspelt:
            raise self.fail(*misspelt)
        mode = self.get(host, "hotplug_mode", str, "host", "native")
        if mode not in HOTPLUG_MODES:
            raise self.fail("host.hotplug_mode", f"{mode!r} is not one of {HOTPLUG_MODES}")
        budget_values = {}
        for key in budgets:
            budget_values[key] = self.get(budgets, key, float, "budgets")
        if len(slots_raw) > MAX_SLOTS:
            raise self.fail("slots", f"{len(slots_raw)} slots: at most {MAX_SLOTS} root ports fit on pcie.0")
        slots = tuple(self.read_slot(i, s) for i, s in enumerate(slots_raw))
        self.check_unique(slots)
        return HostProfile(
            name=self.get(host, "name", str, "host"),
            description=self.get(host, "description", str, "host", ""),
            source=self.path,
            memory_mib=self.get(host, "memory_mib", int, "host", 512),
            cpus=self.get(host, "cpus", int, "host", 1),
            hotplug_mode=mode,
            select_classes=tuple(self.get(runtime, "select_classes", list, "runtime", [])),
            select_ids=tuple(self.get(runtime, "select_ids", list, "runtime", [])),
            budgets=budget_values,
            slots=slots,
            kinds=self.kinds,
        )

    def read_slot(self, index: int, raw: Any) -> Slot:
        where = f"slots[{index}]"
        if not isinstance(raw, dict):
            raise self.fail(where, "expected a table")
        self.only(raw, where, _SLOT_KEYS)
        link = self.get(raw, "link", dict, where)
        self.only(link, f"{where}.link", _LINK_KEYS)
        speed = self.get(link, "speed", str, f"{where}.link")
        width = self.get(link, "width", str, f"{where}.link")
        if speed not in LINK_SPEEDS:
            raise self.fail(f"{where}.link.speed", f"{speed!r} is not one of {LINK_SPEEDS}")
        if width not in LINK_WIDTHS:
            raise self.fail(f"{where}.link.width", f"{width!r} is not one of {LINK_WIDTHS}")
        device = self.get(raw, "device", str, where)
        self.add_model_kind(device, f"{where}.device")
        self.add_model_kind(raw.get("accepts"), f"{where}.accepts")
        if device != EMPTY and device not in self.kinds:
            known = ", ".join([EMPTY, *sorted(self.kinds)])
            raise self.fail(f"{where}.device", f"unknown device kind {device!r} (known: {known})")
        accepts = self.get(raw, "accepts", str, where, device if device != EMPTY else "")
        if accepts not in self.kinds:
            raise self.fail(f"{where}.accepts", f"unknown device kind {accepts!r}")
        real = self.get(raw, "stands_in_for", dict, where)
        self.only(real, f"{where}.stands_in_for", _STANDS_IN_FOR_KEYS)
        stands_in_for = StandsInFor(
            vendor=self.get(real, "vendor", str, f"{where}.stands_in_for"),
            device=self.get(real, "device", str, f"{where}.stands_in_for"),
            model=self.get(real, "model", str, f"{where}.stands_in_for"),
        )
        chassis = self.get(raw, "chassis", int, where)
        slot_number = self.get(raw, "slot", int, where)
        if not 1 <= chassis <= 255:
            raise self.fail(f"{where}.chassis", "must be 1..255")
        return Slot(
            name=self.get(raw, "name", str, where),
            chassis=chassis,
            slot=slot_number,
            link_speed=speed,
            link_width=width,
            device=device,
            accepts=accepts,
            stands_in_for=stands_in_for,
            firmware_version=self.get(raw, "firmware_version", str, where, None),
        )

    def add_model_kind(self, name: Any, key: str) -> None:
        """Make `model:<name>` a device kind: the model's IDs, served by vfio-user-pci."""
        if not isinstance(name, str) or not name.startswith(MODEL_PREFIX) or name in self.kinds:
            return
        try:
            model = load_model(name.removeprefix(MODEL_PREFIX))
        except ModelError as exc:
            raise self.fail(key, str(exc)) from None
        self.kinds[name] = DeviceKind(name=name, qemu_driver="vfio-user-pci", vendor=f"{model.vendor:04x}",
                                      device=f"{model.device:04x}", class_code=model.class_hex,
                                      queue="model")

    def check_unique(self, slots: tuple[Slot, ...]) -> None:
        for attr in ("name", "chassis", "slot"):
            seen: set = set()
            for i, slot in enumerate(slots):
                value = getattr(slot, attr)
                if value in seen:
                    raise self.fail(f"slots[{i}].{attr}", f"duplicate value {value!r}")
                seen.add(value)
