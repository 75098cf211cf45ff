"""Lost configuration: a raw secondary bus reset behind the driver, and its repair."""

from __future__ import annotations

import re
import time

from ..errors import FaultError
from ..host_action import action
from .base import FaultRecord, FaultsBase

CONFIG_TIMEOUT_S = 10.0
BRIDGE_CONTROL_SBR = 0x40
BAR_REGISTERS = tuple(f"BASE_ADDRESS_{i}" for i in range(6))
_HEX = re.compile(r"^[0-9a-f]+$")


class ConfigFaults(FaultsBase):
    """Needs AerFaults beside it (FaultInjector): a driver-bound device is repaired by AER recovery."""

    @action("config-loss")
    def lose_config(self, target: str, timeout_s: float = CONFIG_TIMEOUT_S) -> FaultRecord:
        """Raw secondary bus reset at the port, behind the driver: the device loses its config.

        Verified by reading the device's config back: memory decoding off and
        every BAR's address cleared (or the whole function reading all ones).
        The driver is not told; restore_config() repairs it.
        """
        fault = "config-loss"
        resolved = self._resolve(fault, target)
        self._refuse_if_freezing(fault, resolved)
        bdf, port = resolved.device.bdf, resolved.port_bdf
        before = self._read_config(fault, target, bdf)
        if not any(_bar_address(v) for k, v in before.items() if k.startswith("BASE")):
            raise FaultError(f"{fault} at {target}: {bdf} has no assigned BAR to lose")
        sbr = f"{BRIDGE_CONTROL_SBR:02x}"
        requested_ns = time.monotonic_ns()
        result = self.vm.agent.run(
            ["sh", "-c", f"setpci -s {port} BRIDGE_CONTROL={sbr}:{sbr} && "
                         f"setpci -s {port} BRIDGE_CONTROL=00:{sbr}"], timeout_s=timeout_s)
        injected_ns = time.monotonic_ns()
        if result.exit_code != 0:
            raise FaultError(f"{fault} at {target}: setpci on port {port} failed: "
                             f"{result.stderr.strip()}")
        after = self._read_config(fault, target, bdf)
        lost = after["VENDOR_ID"] == 0xFFFF or (
            not after["COMMAND"] & 0x2
            and not any(_bar_address(v) for k, v in after.items() if k.startswith("BASE")))
        if not lost:
            raise FaultError(f"{fault} at {target}: {bdf} kept its config after the bus reset: "
                             f"{_hexdict(after)}")
        self._lost_config[resolved.name] = before
        return FaultRecord(fault, resolved.name, resolved.device.qdev_id, requested_ns, injected_ns,
                           time.monotonic_ns(), {"bdf": bdf, "port_bdf": port,
                                                 "before": _hexdict(before), "after": _hexdict(after)})

    @action("config-loss")
    def restore_config(self, target: str, timeout_s: float = CONFIG_TIMEOUT_S) -> FaultRecord:
        """Give a device back the config lose_config() took.

        With a driver bound (nvme): a fatal AER at the port, whose recovery resets
        the link and has the driver restore its saved state. Without one (edu):
        the saved BARs and command register are written back with setpci.
        Verified by the BARs reading back as before.
        """
        fault = "config-restore"
        resolved = self._resolve(fault, target)
        saved = self._lost_config.get(resolved.name)
        if saved is None:
            raise FaultError(f"{fault} at {target}: no configuration was lost by this injector")
        bdf = resolved.device.bdf
        has_driver = self.vm.agent.run(["test", "-e", f"/sys/bus/pci/devices/{bdf}/driver"]).exit_code == 0
        requested_ns = time.monotonic_ns()
        if has_driver:
            aer = self.aer_fatal(resolved.name, wait_recovery=True, timeout_s=timeout_s)
            how, injected_ns = f"fatal AER recovery ({aer.details['recovery']})", aer.injected_ns
        else:
            writes = [f"{reg}={value:08x}" for reg, value in saved.items() if reg.startswith("BASE")]
            writes.append(f"COMMAND={saved['COMMAND']:04x}")
            result = self.vm.agent.run(["setpci", "-s", bdf, *writes], timeout_s=timeout_s)
            if result.exit_code != 0:
                raise FaultError(f"{fault} at {target}: setpci on {bdf} failed: "
                                 f"{result.stderr.strip()}")
            how, injected_ns = "setpci write-back", time.monotonic_ns()
        after = self._read_config(fault, target, bdf)
        bars = [k for k in saved if k.startswith("BASE")]
        if any(after[k] != saved[k] for k in bars) or not after["COMMAND"] & 0x2:
            raise FaultError(f"{fault} at {target}: {bdf} reads {_hexdict(after)} after {how}, "
                             f"expected {_hexdict(saved)}")
        del self._lost_config[resolved.name]
        return FaultRecord(fault, resolved.name, resolved.device.qdev_id, requested_ns, injected_ns,
                           time.monotonic_ns(), {"bdf": bdf, "how": how, "config": _hexdict(after)})

    def _read_config(self, fault: str, target: str, bdf: str) -> dict[str, int]:
        registers = ("VENDOR_ID", "COMMAND", *BAR_REGISTERS)
        result = self.vm.agent.run(["setpci", "-s", bdf, *registers], timeout_s=10)
        values = result.stdout.split()
        if result.exit_code != 0 or len(values) != len(registers) or not all(
                _HEX.match(v) for v in values):
            raise FaultError(f"{fault} at {target}: cannot read the config of {bdf} in the guest: "
                             f"{result.stderr.strip() or result.stdout.strip()}")
        return {reg: int(v, 16) for reg, v in zip(registers, values, strict=True)}


def _bar_address(value: int) -> int:
    return value & ~0xF if not value & 0x1 else value & ~0x3


def _hexdict(values: dict[str, int]) -> dict[str, str]:
    return {k: f"{v:x}" for k, v in values.items()}
