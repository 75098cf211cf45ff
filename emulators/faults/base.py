"""What every fault family shares: the record, target resolution, capabilities, checks.

The fault families (hotplug, aer, queue, config, reset, model) are mixins over `FaultsBase`;
`FaultInjector` in this package's __init__ joins them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import FaultError, QmpError
from ..host_action import capabilities_served
from ..pci_inventory import PciFunction, query_pci
from ..profile import DeviceKind, HostProfile, Slot
from ..waiting import poll_until
from ..workload import Workload

# Where each capability applies, in names of the one vocabulary (fixtures/capabilities.toml); what
# serves it is the action declaring it (emulators/host_action.py).
QUEUE_CAPABILITIES = frozenset({"queue-stall", "queue-slow", "queue-error"})
MODEL_CAPABILITIES = frozenset({  # a device model's queue has no I/O errors; only models fall off etc.
    "queue-stall", "queue-slow", "fell-off-bus", "firmware-mismatch", "link-degrade", "reset-not-ready",
})
SLOT_CAPABILITIES = frozenset({"hot-add", "aer-nonfatal", "aer-fatal", "config-loss", "reset"})
POLL_S = 0.05


@dataclass(frozen=True)
class FaultRecord:
    """What a fault injector did, with host monotonic timestamps (ns)."""

    fault: str  # e.g. "aer-fatal"
    target: str  # what it hit: an emulated slot, a real host's BDF
    device_id: str  # what was acted on: a QEMU id (the device, or the port for AER); a BDF on a real host
    requested_ns: int  # just before the injecting command was sent
    injected_ns: int  # when QEMU (or the guest, for config loss) answered it
    verified_ns: int  # when the guest showed the fault had taken effect
    details: dict = field(default_factory=dict)

    @property
    def took_effect_s(self) -> float:
        """Seconds from the injecting command's reply to the verified effect."""
        return (self.verified_ns - self.injected_ns) / 1e9


@dataclass(frozen=True)
class Target:
    """A resolved fault target: the slot, its port, and what sits below it."""

    slot: Slot
    port_bdf: str  # the port above the slot: a root port, or a switch's downstream port
    device: PciFunction | None
    kind: DeviceKind | None  # the stand-in kind, matched by vendor:device
    root_port_bdf: str  # the root port on pcie.0 above the slot (port_bdf unless behind a switch)

    @property
    def name(self) -> str:
        return self.slot.name

    @property
    def port_id(self) -> str:
        return self.slot.port_id


def slot_capabilities(profile: HostProfile, slot: Slot) -> frozenset[str]:
    """What a slot of `profile` can suffer: known before any VM starts (host factories check it).

    Removal without warning needs an ACPI hot-plug host: on a native pciehp slot
    QEMU's device_del presses the slot's attention button (hw/pci/pcie.c), so it
    has no surprise removal there (docs/faults.md). Queue faults need
    a stand-in whose queue is an NBD export (nvme), not edu, or a device model
    (its own knobs: docs/device-models.md).
    """
    caps = set(SLOT_CAPABILITIES)
    caps.add("orderly-removal" if profile.hotplug_mode == "native" else "surprise-removal")
    kind = profile.kind(slot.device if slot.populated else slot.accepts)
    if kind.queue == "nbd":
        caps |= QUEUE_CAPABILITIES
    elif kind.model:
        caps |= MODEL_CAPABILITIES
    return frozenset(caps)


def profile_capabilities(profile: HostProfile) -> frozenset[str]:
    """The union of a profile's slots' capabilities."""
    return frozenset().union(*(slot_capabilities(profile, s) for s in profile.slots))


class FaultsBase:
    def __init__(self, vm):
        self.vm = vm
        self.workload = Workload(vm)
        self._stalls: dict = {}  # slot -> QueueStall still in effect
        self._slowed: set[str] = set()
        self._erroring: set[str] = set()
        self._lost_config: dict[str, dict[str, int]] = {}  # slot -> config before the loss
        self._fallen: set[str] = set()  # model slots whose device fell off the bus
        self._firmware: set[str] = set()  # model slots reporting another firmware version
        self._degraded: set[str] = set()  # model slots whose link trained below capability
        self._slow_reset: set[str] = set()  # model slots that stay not ready after a reset

    # -- capabilities -------------------------------------------------------------------------
    @property
    def capabilities(self) -> frozenset[str]:
        """What this host can suffer: the union of its slots' capabilities."""
        return profile_capabilities(self.vm.profile)

    def slot_capabilities(self, slot_name: str) -> frozenset[str]:
        """Faults a slot supports, from the profile (its device, or what a hot-add puts there)."""
        return slot_capabilities(self.vm.profile, self._slot("capabilities", slot_name))

    def require(self, capability: str, slot_name: str | None = None) -> None:
        """Raise FaultError if the host (or the slot) lacks a capability."""
        served = capabilities_served(type(self))
        if capability not in served:
            raise FaultError(f"unknown fault capability {capability!r} (known: "
                             f"{', '.join(sorted(served))})")
        have = self.slot_capabilities(slot_name) if slot_name else self.capabilities
        if capability not in have:
            where = f"slot {slot_name} of " if slot_name else ""
            raise FaultError(f"{capability}: {where}host {self.vm.profile.name} "
                             f"({self.vm.profile.hotplug_mode} hot-plug) lacks it; it has "
                             f"{', '.join(sorted(have))}")

    # -- targets ------------------------------------------------------------------------------
    def _slot(self, fault: str, name: str) -> Slot:
        for slot in self.vm.profile.slots:
            if slot.name == name:
                return slot
        known = ", ".join(s.name for s in self.vm.profile.slots)
        raise FaultError(f"{fault} at {name}: host {self.vm.profile.name} has no slot {name!r} "
                         f"(slots: {known})")

    def _resolve(self, fault: str, name: str, need_device: bool = True) -> Target:
        """A slot name, or the QEMU id of a device below a slot's port (root or downstream port)."""
        functions = query_pci(self.vm.qmp)
        by_id = {f.qdev_id: f for f in functions if f.qdev_id}
        slots = {s.name: s for s in self.vm.profile.slots}
        if name in slots:
            slot = slots[name]
        elif name in by_id:
            device = by_id[name]
            bus = int(device.bdf.split(":")[1], 16)
            port = next((f for f in functions if f.secondary_bus == bus), None)
            if port is None:
                raise FaultError(f"{fault} at {name}: device {name} ({device.bdf}) sits on the root "
                                 f"complex, with no root port above it")
            slot = next((s for s in slots.values() if s.port_id == port.qdev_id), None)
            if slot is None:
                raise FaultError(f"{fault} at {name}: device {name} ({device.bdf}) is below "
                                 f"{port.qdev_id or port.bdf}, which is not a slot of this host")
        else:
            raise FaultError(f"{fault} at {name}: no slot or device {name!r} on host "
                             f"{self.vm.profile.name} (slots: {', '.join(slots)})")
        port = by_id.get(slot.port_id)
        if port is None or port.secondary_bus is None:
            raise FaultError(f"{fault} at {name}: port {slot.port_id} not found in QEMU")
        root_id = self.vm.profile.root_port_id(slot.name)
        root = by_id.get(root_id)
        if root is None:
            raise FaultError(f"{fault} at {name}: root port {root_id} above slot {slot.name} not found "
                             "in QEMU")
        below = f"0000:{port.secondary_bus:02x}:00.0"
        device = next((f for f in functions if f.bdf == below), None)
        if need_device and device is None:
            raise FaultError(f"{fault} at {name}: slot {slot.name} is empty")
        kind = None
        if device is not None:
            kind = next((k for k in self.vm.profile.kinds.values()
                         if f"{k.vendor}:{k.device}" == device.ids), None)
        return Target(slot, port.bdf, device, kind, root.bdf)

    # -- guards -------------------------------------------------------------------------------
    def _refuse_if_freezing(self, fault: str, target: Target) -> None:
        """A reset or removal of an nvme with a stuck request freezes QEMU until it resumes."""
        backend = self.vm.queues.get(target.name)
        stall = self._stalls.get(target.name)
        if backend is not None and backend.stalled and not (stall and stall.auto_resumes):
            raise FaultError(
                f"{fault} at {target.name}: the slot's queue is stalled with no automatic resume, "
                f"and QEMU freezes (QMP too) while resetting or removing an nvme whose request is "
                f"stuck (measured on 7.2; not yet re-measured on 11.1, so refused on every QEMU); "
                f"stall it with resume_after_s, or resume it first")

    def _refuse_if_stalled(self, fault: str, target: Target, why: str) -> None:
        backend = self.vm.queues.get(target.name)
        if backend is not None and backend.stalled:
            raise FaultError(f"{fault} at {target.name}: the slot's queue is stalled ({why})")

    # -- QEMU and waiting ---------------------------------------------------------------------
    def _qmp(self, fault: str, target: str, command: str, arguments: dict | None = None):
        try:
            return self.vm.qmp.execute(command, arguments)
        except QmpError as exc:
            raise FaultError(f"{fault} at {target}: {exc}") from None

    def _hmp(self, fault: str, target: str, command: str) -> str:
        try:
            return self.vm.qmp.hmp(command)
        except QmpError as exc:
            raise FaultError(f"{fault} at {target}: {exc}") from None

    def _wait(self, fault: str, target: str, timeout_s: float, probe, awaited: str):
        """Call probe() until it returns something truthy; FaultError after timeout_s."""
        return poll_until(probe, timeout_s, f"{fault} at {target}: a sign of {awaited}", every_s=POLL_S,
                          check=self.vm.check_alive, error=FaultError)
