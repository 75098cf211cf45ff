"""Host profiles: TOML data describing an emulated host's slots and budgets.

A profile names, per slot, the port above it (chassis/slot, link caps), the stock
QEMU device standing in for an accelerator, the real device it stands in for,
and the host-wide hot-plug mode and budgets the suites apply. A slot's port is a
root port on pcie.0, or a downstream port of one of the profile's switches.
Loading checks every key and names the file and the key when something is wrong.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .budgets import resolve_budgets
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
# Root ports are the slots not behind a switch, and one per switch (above its upstream port).
MAX_SLOTS = 120
# Downstream ports on a switch's internal bus: one device number each (0x0 ... 0x1f).
MAX_SWITCH_SLOTS = 32
# PCI bus numbers: pcie.0, one below each root port, and per switch its internal bus and one below
# each downstream port.
MAX_BUSES = 256
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
class Switch:
    """A PCIe switch: `x3130-upstream` below a `pcie-root-port` on pcie.0 (chassis/slot and link
    caps of that root port); its slots are `xio3130-downstream` ports on the switch's bus."""

    name: str
    chassis: int
    slot: int
    link_speed: str
    link_width: str

    @property
    def port_id(self) -> str:
        """QEMU id of the root port above the switch's upstream port."""
        return f"rp-sw-{self.name}"

    @property
    def upstream_id(self) -> str:
        """QEMU id of the switch's upstream port (its bus holds the downstream ports)."""
        return f"up-{self.name}"


@dataclass(frozen=True)
class Slot:
    name: str
    chassis: int
    slot: int
    link_speed: str | None  # None behind a switch: a downstream port has no link properties
    link_width: str | None
    device: str  # a DeviceKind name, or "empty"
    accepts: str  # the kind a hot-add puts here by default
    stands_in_for: StandsInFor
    firmware_version: str | None = None
    switch: str | None = None  # the switch whose downstream port the slot is; None: a root port

    @property
    def port_id(self) -> str:
        """QEMU id of the port above the slot (a root port, or a switch's downstream port)."""
        return f"rp-{self.name}"

    @property
    def behind_switch(self) -> bool:
        return self.switch is not None

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
    switches: tuple[Switch, ...] = ()

    def slot(self, name: str) -> Slot:
        for slot in self.slots:
            if slot.name == name:
                return slot
        known = ", ".join(s.name for s in self.slots)
        raise ProfileError(f"profile {self.name!r} has no slot {name!r} (slots: {known})")

    def switch(self, name: str) -> Switch:
        for switch in self.switches:
            if switch.name == name:
                return switch
        known = ", ".join(s.name for s in self.switches) or "none"
        raise ProfileError(f"profile {self.name!r} has no switch {name!r} (switches: {known})")

    @property
    def root_port_slots(self) -> tuple[Slot, ...]:
        """The slots whose port is a root port on pcie.0 (not behind a switch), in profile order."""
        return tuple(s for s in self.slots if not s.behind_switch)

    def slots_below(self, switch_name: str) -> tuple[Slot, ...]:
        """A switch's slots in profile order (its downstream ports, at 0x0, 0x1, ... on its bus)."""
        return tuple(s for s in self.slots if s.switch == switch_name)

    @property
    def root_ports(self) -> int:
        """Root ports on pcie.0: one per slot not behind a switch, and one per switch."""
        return len(self.root_port_slots) + len(self.switches)

    def ports_above(self, slot_name: str) -> tuple[str, ...]:
        """QEMU ids of the ports above a slot, nearest first, ending at the root port on pcie.0:
        (rp-<slot>,) or (rp-<slot>, up-<switch>, rp-sw-<switch>)."""
        slot = self.slot(slot_name)
        if not slot.behind_switch:
            return (slot.port_id,)
        switch = self.switch(slot.switch)
        return (slot.port_id, switch.upstream_id, switch.port_id)

    def root_port_id(self, slot_name: str) -> str:
        """QEMU id of the root port on pcie.0 above a slot (its own port, or its switch's)."""
        return self.ports_above(slot_name)[-1]

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
_TOP_KEYS = {"host", "runtime", "budgets", "slots", "switches"}
_HOST_KEYS = {"name", "description", "memory_mib", "cpus", "hotplug_mode"}
_RUNTIME_KEYS = {"select_classes", "select_ids"}
_SLOT_KEYS = {"name", "chassis", "slot", "link", "device", "accepts", "stands_in_for", "firmware_version",
              "switch"}
_SWITCH_KEYS = {"name", "chassis", "slot", "link"}
_LINK_KEYS = {"speed", "width"}
_STANDS_IN_FOR_KEYS = {"vendor", "device", "model"}


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
        mode = self.get(host, "hotplug_mode", str, "host", "native")
        if mode not in HOTPLUG_MODES:
            raise self.fail("host.hotplug_mode", f"{mode!r} is not one of {HOTPLUG_MODES}")
        budget_values = resolve_budgets(budgets, "emulated", self.fail)
        switches_raw = self.get(self.table, "switches", list, "", [])
        switches = tuple(self.read_switch(i, s) for i, s in enumerate(switches_raw))
        self.check_unique(switches, "switches")
        switch_names = [s.name for s in switches]
        slots = tuple(self.read_slot(i, s, switch_names) for i, s in enumerate(slots_raw))
        self.check_unique(slots, "slots")
        self.check_ports(switches, slots)
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
            switches=switches,
        )

    def read_link(self, raw: dict, where: str) -> tuple[str, str]:
        link = self.get(raw, "link", dict, where)
        self.only(link, f"{where}.link", _LINK_KEYS)
        speed = self.get(link, "speed", str, f"{where}.link")
        width = self.get(link, "width", str, f"{where}.link")
        if speed not in LINK_SPEEDS:
            raise self.fail(f"{where}.link.speed", f"{speed!r} is not one of {LINK_SPEEDS}")
        if width not in LINK_WIDTHS:
            raise self.fail(f"{where}.link.width", f"{width!r} is not one of {LINK_WIDTHS}")
        return speed, width

    def read_chassis_slot(self, raw: dict, where: str) -> tuple[int, int]:
        chassis = self.get(raw, "chassis", int, where)
        slot_number = self.get(raw, "slot", int, where)
        if not 1 <= chassis <= 255:
            raise self.fail(f"{where}.chassis", "must be 1..255")
        return chassis, slot_number

    def read_switch(self, index: int, raw: Any) -> Switch:
        where = f"switches[{index}]"
        if not isinstance(raw, dict):
            raise self.fail(where, "expected a table")
        self.only(raw, where, _SWITCH_KEYS)
        speed, width = self.read_link(raw, where)
        chassis, slot_number = self.read_chassis_slot(raw, where)
        return Switch(name=self.get(raw, "name", str, where), chassis=chassis, slot=slot_number,
                      link_speed=speed, link_width=width)

    def read_slot(self, index: int, raw: Any, switch_names: list[str]) -> Slot:
        where = f"slots[{index}]"
        if not isinstance(raw, dict):
            raise self.fail(where, "expected a table")
        self.only(raw, where, _SLOT_KEYS)
        switch = self.get(raw, "switch", str, where, None)
        if switch is not None and switch not in switch_names:
            known = ", ".join(switch_names) or "the profile has no [[switches]]"
            raise self.fail(f"{where}.switch", f"unknown switch {switch!r} (switches: {known})")
        if switch is None:
            speed, width = self.read_link(raw, where)
        elif "link" in raw:
            raise self.fail(f"{where}.link", "a slot behind a switch has no link caps of its own: QEMU's "
                            "xio3130-downstream has no x-speed/x-width (set the switch's link)")
        else:
            speed = width = None
        device = self.get(raw, "device", str, where)
        self.add_model_kind(device, f"{where}.device")
        self.add_model_kind(raw.get("accepts"), f"{where}.accepts")
        if device != EMPTY and device not in self.kinds:
            known = ", ".join([EMPTY, *sorted(self.kinds)])
            raise self.fail(f"{where}.device", f"unknown device kind {device!r} (known: {known})")
        accepts = self.get(raw, "accepts", str, where, device if device != EMPTY else "")
        if accepts not in self.kinds:
            raise self.fail(f"{where}.accepts", f"unknown device kind {accepts!r}")
        if switch is not None and self.kinds[accepts].model:
            raise self.fail(f"{where}.switch", f"{accepts} behind a switch: a device model's BARs need "
                            "window reserves on its port (mem-reserve, pref64-reserve), which QEMU's "
                            "xio3130-downstream does not take; put the slot on a root port")
        real = self.get(raw, "stands_in_for", dict, where)
        self.only(real, f"{where}.stands_in_for", _STANDS_IN_FOR_KEYS)
        stands_in_for = StandsInFor(
            vendor=self.get(real, "vendor", str, f"{where}.stands_in_for"),
            device=self.get(real, "device", str, f"{where}.stands_in_for"),
            model=self.get(real, "model", str, f"{where}.stands_in_for"),
        )
        chassis, slot_number = self.read_chassis_slot(raw, where)
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
            switch=switch,
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

    def check_unique(self, items: tuple, where: str) -> None:
        """Names, chassis and slot numbers unique within the slots (or within the switches)."""
        for attr in ("name", "chassis", "slot"):
            seen: set = set()
            for i, item in enumerate(items):
                value = getattr(item, attr)
                if value in seen:
                    raise self.fail(f"{where}[{i}].{attr}", f"duplicate value {value!r}")
                seen.add(value)

    def check_ports(self, switches: tuple[Switch, ...], slots: tuple[Slot, ...]) -> None:
        """Across root ports and downstream ports: chassis and slot numbers unique (QEMU refuses a
        second port with a chassis/slot pair, and the guest names hot-plug slots by number), QEMU
        ids unique; every switch has slots; the ports and buses fit."""
        for attr in ("chassis", "slot"):
            owner = {getattr(sw, attr): f"switch {sw.name!r}" for sw in switches}
            for i, slot in enumerate(slots):
                value = getattr(slot, attr)
                if value in owner:
                    raise self.fail(f"slots[{i}].{attr}", f"duplicate value {value!r}: {owner[value]} "
                                    f"has it for its root port")
        ids: dict[str, str] = {}  # QEMU id -> what it names
        for sw in switches:
            ids[sw.port_id] = f"the root port of switch {sw.name!r}"
            ids[sw.upstream_id] = f"the upstream port of switch {sw.name!r}"
        for i, slot in enumerate(slots):
            for qemu_id, what in ((slot.name, "its device"), (slot.port_id, "its port")):
                if qemu_id in ids:
                    raise self.fail(f"slots[{i}].name", f"QEMU id {qemu_id!r} ({what}) is already "
                                    f"{ids[qemu_id]}")
                ids[qemu_id] = f"the {what.removeprefix('its ')} of slot {slot.name!r}"
        for i, sw in enumerate(switches):
            below = [s for s in slots if s.switch == sw.name]
            if not below:
                raise self.fail(f"switches[{i}].name", f"switch {sw.name!r} has no slots (give slots "
                                f"`switch = \"{sw.name}\"`, or drop the switch)")
            if len(below) > MAX_SWITCH_SLOTS:
                raise self.fail(f"switches[{i}].name", f"{len(below)} slots behind switch {sw.name!r}: "
                                f"at most {MAX_SWITCH_SLOTS} downstream ports fit on its bus")
        root_ports = sum(1 for s in slots if s.switch is None) + len(switches)
        if root_ports > MAX_SLOTS:
            raise self.fail("slots", f"{root_ports} root ports ({root_ports - len(switches)} slots not "
                            f"behind a switch, {len(switches)} switches): at most {MAX_SLOTS} root ports "
                            "fit on pcie.0")
        buses = 1 + root_ports + len(switches) + sum(1 for s in slots if s.switch is not None)
        if buses > MAX_BUSES:
            raise self.fail("switches", f"{buses} PCI buses (pcie.0, one per root port, per switch its "
                            f"own bus and one per downstream port): at most {MAX_BUSES}")
