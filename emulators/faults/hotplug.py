"""Hot-add into an empty slot, orderly removal (native pciehp), removal without warning (ACPI)."""

from __future__ import annotations

import time

from ..errors import FaultError, QmpError, WaitTimeout
from ..host_action import action, query
from ..hotplug import hot_add as qemu_hot_add
from ..hotplug_records import HotAdd
from ..pci_inventory import BDF, query_pci
from ..vfio_user.hot_add import release_model
from .base import FaultRecord, FaultsBase

REMOVAL_TIMEOUT_S = {"native": 20.0, "acpi": 10.0}


class HotplugFaults(FaultsBase):
    @action("hot-add")
    def hot_add(self, slot: str, kind: str | None = None, device_id: str | None = None,
                serial_number: int | None = None) -> HotAdd:
        """device_add a unit into an empty slot (a stand-in, or the model the slot accepts, its
        server started first); returns once QEMU lists it below the slot's port, its `returned_ns`
        taken when device_add returned. Whether the guest has it yet is `guest_has_device`'s to say.

        `serial_number`: for a device model, the DSN of the unit added (default: the slot's own)."""
        fault = "hot-add"
        target = self._resolve(fault, slot, need_device=False)
        if target.device is not None:
            raise FaultError(f"{fault} at {slot}: the slot is occupied by "
                             f"{target.device.qdev_id or target.device.bdf}")
        kind_name = kind or target.slot.accepts
        if kind_name not in self.vm.profile.kinds:
            raise FaultError(f"{fault} at {slot}: unknown device kind {kind_name!r} (known: "
                             f"{', '.join(sorted(self.vm.profile.kinds))})")
        try:
            return qemu_hot_add(self.vm, target.name, kind_name, device_id, serial_number)
        except QmpError as exc:
            raise FaultError(f"{fault} at {slot}: {exc}") from None

    @action("hot-add")
    def hot_add_prepared(self, properties: dict) -> int:
        """device_add a unit made ready by `host.unit(slot).add_properties(...)`, for a test that
        times each add itself (DISC-04's storm); when QEMU answered (this controller's monotonic
        ns). Whether QEMU lists it is the test's to check (`ground_truth`)."""
        self._qmp("hot-add", properties.get("id", "?"), "device_add", properties)
        return time.monotonic_ns()

    @query("hot-add", "orderly-removal", "surprise-removal")
    def guest_has_device(self, bdf: str, timeout_s: float) -> bool:
        """Wait (the guest's udev, with a deadline) until the guest has the device; False on timeout."""
        if not BDF.fullmatch(bdf):
            raise FaultError(f"guest_has_device: not a PCI address: {bdf!r}")
        result = self.vm.agent.run(
            ["udevadm", "wait", f"--timeout={max(1, round(timeout_s))}", f"/sys/bus/pci/devices/{bdf}"],
            timeout_s=timeout_s + 10)
        return result.exit_code == 0

    @action("orderly-removal", "surprise-removal")
    def remove(self, target: str, timeout_s: float | None = None) -> FaultRecord:
        """The removal this host's hot-plug mode gives (native pciehp: the attention button, an
        orderly removal; ACPI: a removal without warning); returns once QEMU reported the device
        deleted (`verified_ns`), `requested_ns` taken just before device_del."""
        if self.vm.profile.hotplug_mode == "native":
            return self.remove_orderly(target, timeout_s)
        return self.remove_surprise(target, timeout_s)

    @query("orderly-removal", "surprise-removal")
    def departures(self) -> Departures:
        """Started now: waits for devices that leave the host from now on, however the removal began
        (the runtime's own orderly removal, a slot powered off in the guest)."""
        return Departures(self.vm)

    @action("orderly-removal")
    def remove_orderly(self, target: str, timeout_s: float | None = None) -> FaultRecord:
        """Attention-button removal (native pciehp): device_del, then DEVICE_DELETED (~6.2 s)."""
        return self._remove("orderly-removal", target, timeout_s)

    @action("surprise-removal")
    def remove_surprise(self, target: str, timeout_s: float | None = None) -> FaultRecord:
        """Removal without warning (ACPI hot-plug host): device_del, gone in ~0.1 s."""
        return self._remove("surprise-removal", target, timeout_s)

    def _remove(self, fault: str, name: str, timeout_s: float | None) -> FaultRecord:
        target = self._resolve(fault, name)
        mode = self.vm.profile.hotplug_mode
        if fault not in self.slot_capabilities(target.name):
            other = "remove_surprise" if mode == "acpi" else "remove_orderly"
            why = ("on an ACPI hot-plug host device_del removes without the attention-button "
                   "warning" if mode == "acpi" else
                   "QEMU's device_del on a native pciehp slot presses its attention button: "
                   "no surprise removal there; start the host with hot-plug mode 'acpi'")
            raise FaultError(f"{fault} at {name}: not available on this {mode} hot-plug host "
                             f"({why}); use {other}")
        self._refuse_if_freezing(fault, target)
        timeout_s = timeout_s or REMOVAL_TIMEOUT_S[mode]
        device_id = target.device.qdev_id
        mark = self.vm.qmp.mark()
        requested_ns = time.monotonic_ns()
        self._qmp(fault, name, "device_del", {"id": device_id})
        injected_ns = time.monotonic_ns()
        try:
            event = self.vm.qmp.wait_event(
                "DEVICE_DELETED", after=mark, timeout_s=timeout_s,
                match=lambda data: data.get("device") == device_id, alive=self.vm.check_alive)
        except WaitTimeout:
            raise FaultError(f"{fault} at {name}: no DEVICE_DELETED for {device_id} within "
                             f"{timeout_s:.1f}s (is the guest holding the removal off?)") from None
        if any(f.qdev_id == device_id for f in query_pci(self.vm.qmp)):
            raise FaultError(f"{fault} at {name}: DEVICE_DELETED came but QEMU still lists "
                             f"{device_id}")
        if target.kind is not None and target.kind.model:
            release_model(self.vm, target.name)  # the model's server goes with the device
        return FaultRecord(fault, target.name, device_id, requested_ns, injected_ns,
                           event["host_ns"], {"bdf": target.device.bdf, "hotplug_mode": mode})


class Departures:
    """Devices leaving a QEMU host from a moment on: QEMU's DEVICE_DELETED after it."""

    def __init__(self, vm):
        self.vm = vm
        self.names = {f.bdf: f.qdev_id for f in query_pci(vm.qmp) if f.qdev_id}
        self.mark = vm.qmp.mark()

    def wait_gone(self, bdf: str, timeout_s: float) -> int | None:
        """When (this controller's monotonic ns) QEMU reported the device at `bdf` when the watch
        began deleted; None by the deadline."""
        device_id = self.names.get(bdf)
        if device_id is None:
            raise FaultError(f"departure of {bdf}: QEMU had no device there when the watch began")
        try:
            event = self.vm.qmp.wait_event("DEVICE_DELETED", after=self.mark, timeout_s=timeout_s,
                                           match=lambda data: data.get("device") == device_id,
                                           alive=self.vm.check_alive)
        except WaitTimeout:
            return None
        return event["host_ns"]
