"""Hot-add a device model into an empty slot: serve it first, then QMP device_add.

The server must listen before `device_add`, because QEMU connects while
realizing the device. Removal is the ordinary `hotplug.remove` (device_del,
DEVICE_DELETED); `release_model` then stops the slot's server.

A hot-add gets a fresh server device, so a knob set on the slot's previous device
is gone; `firmware_version` arms the new device before QEMU (and so the guest)
can read it: the card arrives with that firmware, with no window in which a
runtime's self-check could read the model's own.
"""

from __future__ import annotations

import json
import time

from ..errors import FaultError, InfrastructureError
from ..hotplug_records import HotAdd
from ..pci_inventory import function_below, query_pci
from ..qemu_command import model_socket, stand_in_device


def serve_for_hot_add(vm, slot_name: str, device_id: str | None = None,
                      firmware_version: str | None = None, serial_number: int | None = None) -> dict:
    """Start the server of the model an empty slot accepts; the device_add properties for it.

    The first half of `hot_add_model`, for callers that time the `device_add` themselves
    (DISC-04's storm). `firmware_version` ("MAJOR.MINOR.PATCH"): the new card's firmware
    register reports it from the start (a firmware mismatch armed before the card appears);
    ValueError if malformed. `serial_number`: the new card's DSN (another unit of the same
    model); by default the slot's own unit comes back.
    """
    slot = vm.profile.slot(slot_name)
    kind = vm.profile.kind(slot.accepts)
    if not kind.model:
        raise FaultError(f"hot-add model: slot {slot_name} accepts {kind.name}, not a device model")
    functions = query_pci(vm.qmp)
    bdf = function_below(functions, slot.port_id)
    if bdf is None:
        raise FaultError(f"hot-add model: port {slot.port_id} of slot {slot_name} not found")
    occupant = next((f for f in functions if f.bdf == bdf), None)
    if occupant is not None:
        raise FaultError(f"hot-add model: slot {slot_name} is occupied by {occupant.qdev_id or bdf}")
    device_id = device_id or f"{slot_name}-{kind.model}"
    vm.models.release(slot_name)  # a server left from an earlier occupant of the slot
    server = vm.models.serve(slot_name, kind.model, model_socket(vm.layout, slot_name), device_id,
                             serial_number)
    if firmware_version is not None:
        try:
            server.device.set_firmware_version(firmware_version)
        except ValueError:
            vm.models.release(slot_name)
            raise
    return stand_in_device(slot, kind, device_id, vm.layout)


def hot_add_model(vm, slot_name: str, device_id: str | None = None,
                  firmware_version: str | None = None, serial_number: int | None = None) -> HotAdd:
    """Serve the model the slot accepts and device_add it; check QEMU lists it below the port.
    The arguments: `serve_for_hot_add`."""
    props = serve_for_hot_add(vm, slot_name, device_id, firmware_version, serial_number)
    try:
        vm.qmp.execute("device_add", props)
    except BaseException:
        vm.models.release(slot_name)
        raise
    returned_ns = time.monotonic_ns()
    functions = query_pci(vm.qmp)
    if not any(f.qdev_id == props["id"] for f in functions):
        raise InfrastructureError(f"hot-add model: device_add {json.dumps(props)} returned but QEMU "
                                  "does not list it")
    bdf = function_below(functions, vm.profile.slot(slot_name).port_id)
    return HotAdd(slot_name, props["id"], bdf, returned_ns)


def release_model(vm, slot_name: str) -> None:
    """Stop the server of a slot whose device has been removed."""
    vm.models.release(slot_name)
