"""Hot-add into an empty slot and removal, each checked to have taken effect.

Removal waits for QEMU's `DEVICE_DELETED`: under native pciehp the guest
blinks for 5 s first (about 6.2 s in all); in ACPI mode it takes ~0.1 s and the
guest sees a removal without warning.
"""

from __future__ import annotations

import json
import time

from .errors import FaultError, InfrastructureError
from .hotplug_records import HotAdd, Removal
from .pci_inventory import function_below, query_pci
from .qemu_command import nbd_blockdev, queue_node, stand_in_device
from .vfio_user.hot_add import hot_add_model

REMOVAL_TIMEOUT_S = {"native": 20.0, "acpi": 10.0}


def hot_add(vm, slot_name: str, kind_name: str | None = None,
            device_id: str | None = None, serial_number: int | None = None) -> HotAdd:
    """device_add a stand-in into an empty slot; check QEMU shows it below the port.

    `serial_number`: for a device model, the DSN of the unit added (default: the slot's own)."""
    slot = vm.profile.slot(slot_name)
    kind = vm.profile.kind(kind_name or slot.accepts)
    if kind.model:  # a device model: its vfio-user server must listen before device_add
        if kind.name != slot.accepts:
            raise FaultError(f"hot-add: slot {slot_name} accepts {slot.accepts}; a model is served "
                             f"only where the profile puts it (not {kind.name})")
        return hot_add_model(vm, slot_name, device_id, serial_number=serial_number)
    if serial_number is not None:
        raise FaultError(f"hot-add: {kind.name} in slot {slot_name} takes no serial number (models only)")
    functions = query_pci(vm.qmp)
    bdf = function_below(functions, slot.port_id)
    if bdf is None:
        raise FaultError(f"hot-add: port {slot.port_id} of slot {slot_name} not found")
    occupant = next((f for f in functions if f.bdf == bdf), None)
    if occupant is not None:
        raise FaultError(f"hot-add: slot {slot_name} is occupied by {occupant.qdev_id or bdf}")
    if kind.queue == "nbd":
        vm.queue_backend(slot_name)
        existing = {n.get("node-name") for n in vm.qmp.execute("query-named-block-nodes")}
        if queue_node(slot_name) not in existing:
            vm.qmp.execute("blockdev-add", nbd_blockdev(vm.layout, slot_name))
    props = stand_in_device(slot, kind, device_id or f"{slot_name}-{kind.name}")
    vm.qmp.execute("device_add", props)
    returned_ns = time.monotonic_ns()
    if not any(f.qdev_id == props["id"] for f in query_pci(vm.qmp)):
        raise InfrastructureError(
            f"hot-add: device_add {json.dumps(props)} returned but QEMU does not list it")
    return HotAdd(slot_name, props["id"], bdf, returned_ns)


def remove(vm, device_id: str, timeout_s: float | None = None) -> Removal:
    """device_del and wait for DEVICE_DELETED (the guest let go of the device)."""
    timeout_s = timeout_s or REMOVAL_TIMEOUT_S[vm.profile.hotplug_mode]
    if not any(f.qdev_id == device_id for f in query_pci(vm.qmp)):
        raise FaultError(f"remove: no device {device_id!r} on this host")
    mark = vm.qmp.mark()
    requested_ns = time.monotonic_ns()
    vm.qmp.execute("device_del", {"id": device_id})
    event = vm.qmp.wait_event(
        "DEVICE_DELETED", after=mark, timeout_s=timeout_s,
        match=lambda data: data.get("device") == device_id, alive=vm.check_alive,
    )
    return Removal(device_id, requested_ns, event["host_ns"])
