"""Hot-add into an empty slot, orderly removal (native pciehp), removal without warning (ACPI)."""

from __future__ import annotations

import time

from ..errors import FaultError, QmpError, WaitTimeout
from ..hotplug import hot_add as qemu_hot_add
from ..pci_inventory import query_pci
from ..vfio_user.hot_add import release_model
from .base import FaultRecord, FaultsBase

HOT_ADD_TIMEOUT_S = 20.0
REMOVAL_TIMEOUT_S = {"native": 20.0, "acpi": 10.0}


class HotplugFaults(FaultsBase):
    def hot_add(self, slot: str, kind: str | None = None, device_id: str | None = None,
                timeout_s: float = HOT_ADD_TIMEOUT_S) -> FaultRecord:
        """device_add a stand-in into an empty slot; verified when the guest has the device."""
        fault = "hot-add"
        target = self._resolve(fault, slot, need_device=False)
        if target.device is not None:
            raise FaultError(f"{fault} at {slot}: the slot is occupied by "
                             f"{target.device.qdev_id or target.device.bdf}")
        kind_name = kind or target.slot.accepts
        if kind_name not in self.vm.profile.kinds:
            raise FaultError(f"{fault} at {slot}: unknown device kind {kind_name!r} (known: "
                             f"{', '.join(sorted(self.vm.profile.kinds))})")
        requested_ns = time.monotonic_ns()
        try:
            added = qemu_hot_add(self.vm, target.name, kind_name, device_id)
        except QmpError as exc:
            raise FaultError(f"{fault} at {slot}: {exc}") from None
        result = self.vm.agent.run(
            ["udevadm", "wait", f"--timeout={max(1, round(timeout_s))}",
             f"/sys/bus/pci/devices/{added.bdf}"], timeout_s=timeout_s + 10)
        if result.exit_code != 0:
            raise FaultError(f"{fault} at {slot}: QEMU added {added.device_id} but the guest did "
                             f"not show {added.bdf} within {timeout_s:.0f}s")
        return FaultRecord(fault, target.name, added.device_id, requested_ns, added.returned_ns,
                           time.monotonic_ns(), {"bdf": added.bdf, "kind": kind_name})

    def remove_orderly(self, target: str, timeout_s: float | None = None) -> FaultRecord:
        """Attention-button removal (native pciehp): device_del, then DEVICE_DELETED (~6.2 s)."""
        return self._remove("orderly-removal", target, timeout_s)

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
                   "QEMU 7.2 has no surprise removal under native pciehp; start the host "
                   "with hot-plug mode 'acpi'")
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
