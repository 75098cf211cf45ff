"""Ground-truth PCI inventory: what QEMU says it emulates, and what the guest lists.

`query-pci` walks QEMU's own bus tree (the truth the runtime is judged
against); `lspci` in the guest shows what the kernel enumerated. Both become
the same record so they can be compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PciFunction:
    bdf: str  # "0000:01:00.0"
    vendor_id: int
    device_id: int
    class_code: int  # class and subclass, 16 bits (lspci -n's "0108")
    qdev_id: str = ""
    secondary_bus: int | None = None  # for bridges/ports: the bus below

    @property
    def ids(self) -> str:
        return f"{self.vendor_id:04x}:{self.device_id:04x}"

    def key(self) -> tuple[str, int, int, int]:
        """What must agree between QEMU and the guest."""
        return (self.bdf, self.vendor_id, self.device_id, self.class_code)


def query_pci(qmp) -> list[PciFunction]:
    functions: list[PciFunction] = []
    for bus in qmp.execute("query-pci"):
        _walk(bus["devices"], functions)
    return sorted(functions, key=lambda f: f.bdf)


def _walk(devices: list[dict], out: list[PciFunction]) -> None:
    for dev in devices:
        bridge = dev.get("pci_bridge")
        out.append(PciFunction(
            bdf=f"0000:{dev['bus']:02x}:{dev['slot']:02x}.{dev['function']}",
            vendor_id=dev["id"]["vendor"],
            device_id=dev["id"]["device"],
            class_code=dev["class_info"]["class"],
            qdev_id=dev.get("qdev_id", ""),
            secondary_bus=bridge["bus"]["secondary"] if bridge else None,
        ))
        if bridge:
            _walk(bridge.get("devices", []), out)


BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")  # a full PCI address, domain first
_LSPCI_LINE = re.compile(r"^(\S+) ([0-9a-f]{4}): ([0-9a-f]{4}):([0-9a-f]{4})")


def parse_lspci(text: str) -> list[PciFunction]:
    """Parse `lspci -D -n` output."""
    functions = []
    for line in text.splitlines():
        match = _LSPCI_LINE.match(line.strip())
        if match:
            bdf, cls, vendor, device = match.groups()
            functions.append(PciFunction(bdf, int(vendor, 16), int(device, 16), int(cls, 16)))
    return sorted(functions, key=lambda f: f.bdf)


def guest_lspci(agent) -> list[PciFunction]:
    return parse_lspci(agent.run(["lspci", "-D", "-n"]).check().stdout)


def function_below(functions: list[PciFunction], port_qdev_id: str) -> str | None:
    """The BDF of function 0 on the bus below a port: a root port or a switch's downstream port
    (None if the port is unknown)."""
    for fn in functions:
        if fn.qdev_id == port_qdev_id and fn.secondary_bus is not None:
            return f"0000:{fn.secondary_bus:02x}:00.0"
    return None
