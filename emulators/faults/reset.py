"""A reset the guest kernel does (sysfs `reset`: the method the device's reset_method names)."""

from __future__ import annotations

from ..errors import FaultError
from ..guest_agent import GuestResult
from ..host_action import action
from ..pci_inventory import BDF
from .base import FaultsBase


class ResetFaults(FaultsBase):
    @action("reset")
    def reset(self, bdf: str, timeout_s: float = 30.0) -> GuestResult:
        """Have the guest kernel reset a device; returns once the write to its `reset` returned."""
        if not BDF.fullmatch(bdf):
            raise FaultError(f"reset: not a PCI address: {bdf!r}")
        return self.vm.agent.shell(f"echo 1 > /sys/bus/pci/devices/{bdf}/reset", timeout_s=timeout_s).check()
