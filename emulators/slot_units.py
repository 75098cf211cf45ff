"""A slot's unit, whatever stands in it: the one place that tells a QEMU stand-in from a device model.

Why: the suites insert another unit of the same kind into a slot (DISC-05), storm every empty
slot with a timed device_add each (DISC-04) and read a unit's identity as the runtime should
report it. A QEMU stand-in (nvme) carries its identity as a `serial` string on a block node;
a device model (vfio-user) carries a Device Serial Number and needs its server listening
before `device_add`. `slot_unit(vm, slot)` gives the backend for what a slot holds (or, empty,
what it accepts); the suites never ask which kind it is.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from .errors import FaultError, InfrastructureError
from .hotplug_records import HotAdd
from .pci_inventory import function_below, query_pci
from .qemu_command import stand_in_device
from .vfio_user.hot_add import hot_add_model, serve_for_hot_add

NULL_DISK_BYTES = 64 << 20  # a storm's stand-in reads nothing: a null block node of this size


class SlotUnit(ABC):
    """What a slot's unit is to a test: its identity, and how another one is put in."""

    has_identity = False  # the unit carries a serial number of its own (else its slot is its identity)

    def __init__(self, vm, slot_name: str):
        self.vm = vm
        self.slot = vm.profile.slot(slot_name)
        self.kind = vm.profile.kind(self.slot.device if self.slot.populated else self.slot.accepts)

    @abstractmethod
    def identity(self, qdev_id: str):
        """The identity QEMU gives the unit `qdev_id` in this slot (None: it has none)."""

    @abstractmethod
    def identity_text(self, identity) -> str | None:
        """`identity` as the runtime's protocol reports it."""

    @abstractmethod
    def reported_identity(self, record: dict) -> str | None:
        """The unit's identity as a runtime's device record shows it."""

    @abstractmethod
    def other_identity(self, identity, n: int):
        """The identity of the n-th other unit of the same model."""

    @abstractmethod
    def add_properties(self, device_id: str, identity=None, medium: str = "queue") -> dict:
        """`device_add` properties for a unit in the (empty) slot, with everything it needs made
        first, so a caller can time the device_add alone. `medium` for a unit with a command
        queue: "queue" (the slot's stallable NBD export) or "null" (reads nothing, DISC-04)."""

    def insert(self, device_id: str, identity=None) -> HotAdd:
        """device_add a unit with `identity` (None: the slot's own) into the empty slot."""
        props = self.add_properties(device_id, identity)
        self.vm.qmp.execute("device_add", props)
        returned_ns = time.monotonic_ns()
        functions = query_pci(self.vm.qmp)
        if not any(f.qdev_id == device_id for f in functions):
            raise InfrastructureError(f"device_add {device_id} into {self.slot.name} returned but QEMU "
                                      "does not list it")
        return HotAdd(self.slot.name, device_id, function_below(functions, self.slot.port_id), returned_ns)


class StandInUnit(SlotUnit):
    """QEMU's own devices: an nvme with a `serial` on a block node; edu has no identity."""

    def __init__(self, vm, slot_name: str):
        super().__init__(vm, slot_name)
        self.has_identity = self.kind.queue == "nbd"
        self._drive: str | None = None

    def _qom(self, qdev_id: str, prop: str):
        return self.vm.qmp.execute("qom-get", {"path": f"/machine/peripheral/{qdev_id}", "property": prop})

    def identity(self, qdev_id: str):
        if not self.has_identity:
            return None
        self._drive = self._drive or self._qom(qdev_id, "drive")  # another unit reuses its block node
        return self._qom(qdev_id, "serial")

    def identity_text(self, identity) -> str | None:
        return identity

    def reported_identity(self, record: dict) -> str | None:
        return record["info"].get("serial")

    def other_identity(self, identity, n: int) -> str:
        return f"{self.slot.name.upper()}-OTHER{n}"[:20]

    def add_properties(self, device_id: str, identity=None, medium: str = "queue") -> dict:
        props = stand_in_device(self.slot, self.kind, device_id)
        if not self.has_identity:
            return props
        if medium == "null":
            props["drive"] = self._null_node()
        elif self._drive is not None:
            props["drive"] = self._drive
        if identity is not None:
            props["serial"] = str(identity)[:20]
        return props

    def _null_node(self) -> str:
        node = f"null-{self.slot.name}"
        existing = {n.get("node-name") for n in self.vm.qmp.execute("query-named-block-nodes")}
        if node not in existing:
            self.vm.qmp.execute("blockdev-add", {"driver": "null-co", "node-name": node,
                                                 "size": NULL_DISK_BYTES})
        return node


class ModelUnit(SlotUnit):
    """A vfio-user device model: a DSN number; its server must listen before device_add."""

    has_identity = True

    def identity(self, qdev_id: str) -> int:
        return self.vm.models.device(self.slot.name).config.serial_number

    def identity_text(self, identity) -> str | None:
        """A DSN as the protocol reports it (most significant byte first, as lspci shows it)."""
        return "-".join(f"{b:02x}" for b in int(identity).to_bytes(8, "big"))

    def reported_identity(self, record: dict) -> str | None:
        return record["info"]["capabilities"].get("dsn")

    def other_identity(self, identity, n: int) -> int:
        return int(identity) ^ (n << 24)  # another unit of the same model: its unit number differs

    def add_properties(self, device_id: str, identity=None, medium: str = "queue") -> dict:
        return serve_for_hot_add(self.vm, self.slot.name, device_id, serial_number=identity)

    def insert(self, device_id: str, identity=None) -> HotAdd:
        return hot_add_model(self.vm, self.slot.name, device_id, serial_number=identity)


def slot_unit(vm, slot_name: str) -> SlotUnit:
    """The backend for the unit a slot holds (or, empty, accepts)."""
    if slot_name not in {s.name for s in vm.profile.slots}:
        raise FaultError(f"no slot {slot_name!r} on host {vm.profile.name}")
    slot = vm.profile.slot(slot_name)
    kind = vm.profile.kind(slot.device if slot.populated else slot.accepts)
    return ModelUnit(vm, slot_name) if kind.model else StandInUnit(vm, slot_name)
