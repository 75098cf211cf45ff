"""Helpers shared by the DISC suite: independent readers of the ground truth and event waits.

The runtime's records are judged against readers that share no code with it:
QEMU's own bus tree (QMP `query-pci`, host side) and the guest kernel's view
read through the guest agent (sysfs attributes and pciutils' `lspci -vvv`).
Nothing here imports the runtime's parsers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.host_protocol import (
    budget,  # noqa: F401 (the DISC tests import it from here)
    ms_to_event,
)
from hilconform.fixtures.node_clock import bare_python_start
from hilconform.fixtures.runtime_waits import (  # noqa: F401 (the DISC tests import them from here)
    COLD_DISCOVERY_TIMEOUT_S,
    subscribe_from_start,
    wait_boot_self_checks,
    wait_discovered,
    wait_removed,
    wait_self_check_end,
)
from hilconform.fixtures.udev_settle import wait_udev_settled
from hilconform.fixtures.uevent_witness import GuestUeventWitness  # noqa: F401 (DISC-02/04 use it)

REMOVED_CAUSES = {"hot_remove", "surprise", "vanished"}  # docs/protocol.md, event `removed`
BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def ms_between(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e6


# A wait, not a measurement: under a loaded CI runner (load 9 on 2 cores, benchmarks/loaded_gate.py)
# a restored a100 guest's udev queue was still not empty after 20 s, and the test
# broke on it; waiting longer costs nothing where the guest is quiet sooner.
QUIET_TIMEOUT_S = 60.0


def guest_quiet(host, bdf: str | None = None, timeout_s: float = QUIET_TIMEOUT_S) -> None:
    """Wait until the guest is done with a new device, before the test removes it.

    * the guest's udev queue is empty (e.g. blkid done probing a new disk): removing a
      queue device while the guest still reads it makes the runtime's drain time out
      and reset the device mid-removal, and QEMU then never completed the unplug (no
      DEVICE_DELETED; measured on 7.2 and not re-measured since, so the guard stays);
    * with `bdf`, the power indicator of the slot above it no longer blinks: QEMU
      refuses `device_del` while it does ("guest is busy"), which pciehp can leave on
      for a moment after a hot-add.

    Discovery clauses do not exercise those paths, so they remove quiet devices.
    """
    wait_udev_settled(host, timeout_s)
    if bdf is None:
        return
    if not BDF_RE.match(bdf):
        raise ValueError(f"not a PCI address: {bdf!r}")
    steady = host.shell(
        f"port=$(basename \"$(dirname \"$(readlink -f /sys/bus/pci/devices/{bdf})\")\"); "
        f"for i in $(seq {int(timeout_s * 10)}); do "
        "lspci -vvv -s \"$port\" | grep -q 'PwrInd Blink' || exit 0; sleep 0.1; done; exit 1",
        timeout_s=timeout_s + 10)
    if steady.exit_code != 0:
        raise InfrastructureError(f"the power indicator of the slot above {bdf} still blinks after "
                                  f"{timeout_s:.0f}s")




def node_driver(host, bdf: str) -> str | None:
    """The driver the node's kernel has bound to `bdf` (sysfs `driver` link), None when none."""
    if not BDF_RE.match(bdf):
        raise ValueError(f"not a PCI address: {bdf!r}")
    link = host.run(["readlink", f"/sys/bus/pci/devices/{bdf}/driver"], timeout_s=20)
    return link.stdout.strip().rsplit("/", 1)[-1] if link.exit_code == 0 and link.stdout.strip() else None


BROUGHT_BACK = 3  # devices taken away without warning and brought back, on any host


def remove_and_bring_back(host, count: int = BROUGHT_BACK) -> list[tuple[float, float]]:
    """Take up to `count` devices away without warning, one after the other, and bring each back
    (any host offering surprise-removal and hot-add); (removed ms, discovered ms) per device.

    Each figure runs from the host's record of the request to the runtime's event, on one clock
    (`ms_to_event`). Checked: `removed` with a removal cause, gone from the inventory and the
    latest topology; `discovered` with cause hot_add and the same IDs, its self-check ended
    HEALTHY and in the pool, the driver it had bound again (the host is left as found).
    """
    runtime = host.runtime
    wait_boot_self_checks(runtime)
    figures = []
    for target in host.targets("surprise-removal")[:count]:
        bdf = host.target_bdf(target)
        before = runtime.call("device", {"device": bdf})
        driver = node_driver(host, bdf)
        guest_quiet(host)
        mark = runtime.mark()
        removal = host.get("surprise-removal").remove(target)
        removed = wait_removed(runtime, bdf, mark)
        cause = removed["data"]["cause"]
        assert cause in REMOVED_CAUSES, f"removed {bdf} with cause {cause!r}"
        assert bdf not in {d["device"] for d in runtime.call("inventory")["devices"]}, (
            f"{bdf} still in the inventory after `removed`")
        latest = runtime.events(mark, "topology")
        assert latest and bdf not in latest[-1]["data"]["devices"], (
            f"no topology rebuild without {bdf} after its removal: {[t['data'] for t in latest]}")
        mark = runtime.mark()
        added = host.get("hot-add").hot_add(target)
        assert added.bdf == bdf, f"{target} came back at {added.bdf}, not at {bdf}"
        found = wait_discovered(runtime, bdf, mark)
        info, was = found["data"]["info"], before["info"]
        assert found["data"]["cause"] == "hot_add", f"discovered {bdf} with cause {found['data']['cause']!r}"
        assert (info["vendor_id"], info["device_id"]) == (was["vendor_id"], was["device_id"]), (
            f"{bdf} came back as {info['vendor_id']}:{info['device_id']}")
        wait_self_check_end(runtime, bdf, mark)
        record = runtime.call("device", {"device": bdf})
        assert record["state"] == "HEALTHY" and record["in_pool"], f"{bdf} after it came back: {record}"
        assert node_driver(host, bdf) == driver, f"{bdf} came back without its driver {driver}"
        figures.append((ms_to_event(removal, removed), ms_to_event(added, found)))
    assert runtime.violations == []
    return figures


# -- ground truth: QEMU (query-pci) --------------------------------------------------------------

@dataclass(frozen=True)
class QemuFunction:
    """One PCI function as QEMU's own bus tree describes it (QMP query-pci)."""

    bdf: str
    qdev_id: str
    vendor_id: int
    device_id: int
    subsystem_vendor_id: int | None
    subsystem_id: int | None
    class_code16: int  # class << 8 | subclass (query-pci has no prog-if)
    bars: dict[int, dict]  # index -> {size, kind, prefetchable, address}
    port_qdev_id: str | None  # the bridge/port it sits below


def qemu_functions(host) -> dict[str, QemuFunction]:
    """Every function QEMU emulates, by BDF (QMP query-pci, walked here without project code)."""
    out: dict[str, QemuFunction] = {}

    def walk(devices: list[dict], parent: str | None) -> None:
        for dev in devices:
            bdf = f"0000:{dev['bus']:02x}:{dev['slot']:02x}.{dev['function']}"
            bars = {}
            for region in dev.get("regions", []):
                if region["bar"] > 5:  # the expansion ROM is not a BAR
                    continue
                if region["type"] == "io":
                    kind = "io"
                else:
                    kind = "mem64" if region.get("mem_type_64") else "mem32"
                bars[region["bar"]] = {"size": region["size"], "kind": kind,
                                       "prefetchable": bool(region.get("prefetch", False)),
                                       "address": region["address"]}
            ids = dev["id"]
            out[bdf] = QemuFunction(bdf, dev.get("qdev_id", ""), ids["vendor"], ids["device"],
                                    ids.get("subsystem-vendor"), ids.get("subsystem"),
                                    dev["class_info"]["class"], bars, parent)
            bridge = dev.get("pci_bridge")
            if bridge:
                walk(bridge.get("devices", []), dev.get("qdev_id") or bdf)

    for bus in host.get("qmp").bus_tree():
        walk(bus["devices"], None)
    return out


def profile_selects(profile, fn: QemuFunction) -> bool:
    """Whether the profile's [runtime] selection names the function (class prefix or IDs).

    query-pci has no programming interface, so a 6-digit class prefix is judged on its
    first 4 digits (the shipped profiles select by IDs).
    """
    ids = f"{fn.vendor_id:04x}:{fn.device_id:04x}"
    vendor_any = f"{fn.vendor_id:04x}:*"
    klass = f"{fn.class_code16:04x}"
    by_class = any(klass.startswith(c[:4].lower()) or c == "*" for c in profile.select_classes)
    return by_class or any(i.lower() in (ids, vendor_any) for i in profile.select_ids)


def expected_managed(host) -> dict[str, QemuFunction]:
    """The endpoints QEMU has that the runtime must manage, by BDF."""
    return {bdf: fn for bdf, fn in qemu_functions(host).items() if profile_selects(host.profile, fn)}


def bdf_in_slot(host, slot_name: str) -> str | None:
    """BDF of the function QEMU shows below the slot's root port (None if the slot is empty)."""
    port = host.profile.slot(slot_name).port_id
    for fn in qemu_functions(host).values():
        if fn.port_qdev_id == port:
            return fn.bdf
    return None


# -- ground truth: the guest kernel (sysfs + lspci) ----------------------------------------------

@dataclass
class GuestView:
    """One function as the guest kernel shows it: sysfs attributes and pciutils' decoding."""

    bdf: str
    attrs: dict[str, str] = field(default_factory=dict)
    driver: str | None = None
    resources: list[tuple[int, int, int]] = field(default_factory=list)
    lspci: str = ""

    def hex_attr(self, name: str) -> int | None:
        value = self.attrs.get(name, "")
        return int(value, 16) if value.startswith("0x") else None

    # -- sysfs ----------------------------------------------------------------------------------
    def bars(self) -> dict[int, dict]:
        """BARs 0-5 that the kernel assigned (sysfs `resource`), with size and kind from its flags."""
        out = {}
        for index, (start, end, flags) in enumerate(self.resources[:6]):
            if end <= start or not flags & 0x300:
                continue
            kind = "io" if flags & 0x100 else "mem64" if flags & 0x100000 else "mem32"
            out[index] = {"size": end - start + 1, "kind": kind,
                          "prefetchable": bool(flags & 0x2000), "address": start}
        return out

    def sysfs_link(self) -> dict:
        """max/current link speed (GT/s) and width from sysfs; {} when the function has none."""
        def speed(name):
            match = re.match(r"([\d.]+) GT/s", self.attrs.get(name, ""))
            return float(match.group(1)) if match else None

        def width(name):
            value = self.attrs.get(name, "")
            return int(value) if value.isdigit() else None

        link = {"cap_speed_gts": speed("max_link_speed"), "cap_width": width("max_link_width"),
                "speed_gts": speed("current_link_speed"), "width": width("current_link_width")}
        return link if any(v is not None for v in link.values()) else {}

    # -- lspci -vvv -----------------------------------------------------------------------------
    def capability_lines(self) -> list[tuple[int, str]]:
        """(offset, text) of every `Capabilities: [off] ...` line."""
        return [(int(off, 16), text.strip()) for off, text in
                re.findall(r"^\s*Capabilities: \[([0-9a-f]+)(?: v\d+)?\] (.*)$", self.lspci, re.M)]

    def has_cap(self, prefix: str) -> bool:
        return any(text.startswith(prefix) for _, text in self.capability_lines())

    def lspci_capabilities(self) -> dict:
        caps = self.capability_lines()
        msix = re.search(r"MSI-X: Enable([+-]) Count=(\d+)", self.lspci)
        msi = re.search(r"\] MSI: Enable([+-]) Count=(\d+)/(\d+)", self.lspci)
        express = re.search(r"\] Express \(v(\d+)\) ([A-Za-z ]+?)(?:,|$)", self.lspci, re.M)
        devcap = re.search(r"DevCap:(.*?)DevCtl:", self.lspci, re.S)
        dsn = re.search(r"Device Serial Number ([0-9a-f-]+)", self.lspci)
        return {
            "pcie": self.has_cap("Express"),
            "pm": self.has_cap("Power Management"),
            "msi": msi is not None,
            "msix": msix is not None,
            "aer": self.has_cap("Advanced Error Reporting"),
            "flr": bool(devcap and "FLReset+" in devcap.group(1)),
            "dsn": dsn.group(1) if dsn else None,
            "pcie_version": int(express.group(1)) if express else None,
            "port_type": express.group(2).strip().lower().replace(" ", "_") if express else None,
            "msix_enabled": bool(msix and msix.group(1) == "+"),
            "msix_table_size": int(msix.group(2)) if msix else None,
            "msi_enabled": bool(msi and msi.group(1) == "+"),
            "msi_vectors": int(msi.group(3)) if msi else None,
            "standard_count": sum(1 for off, _ in caps if off < 0x100),
            "extended_count": sum(1 for off, _ in caps if off >= 0x100),
        }

    def lspci_link(self) -> dict:
        """LnkCap / LnkSta speed and width as pciutils decodes them; {} without a link."""
        cap = re.search(r"LnkCap:.*?Speed ([\d.]+)GT/s.*?Width x(\d+)", self.lspci)
        sta = re.search(r"LnkSta:.*?Speed ([\d.]+)GT/s.*?Width x(\d+)", self.lspci)
        if not cap and not sta:
            return {}
        return {"cap_speed_gts": float(cap.group(1)) if cap else None,
                "cap_width": int(cap.group(2)) if cap else None,
                "speed_gts": float(sta.group(1)) if sta else None,
                "width": int(sta.group(2)) if sta else None}

    def lspci_driver(self) -> str | None:
        match = re.search(r"Kernel driver in use: (\S+)", self.lspci)
        return match.group(1) if match else None

    def physical_slot(self) -> str | None:
        match = re.search(r"Physical Slot: (\S+)", self.lspci)
        return match.group(1) if match else None


_SYSFS_ATTRS = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class", "revision",
                "max_link_speed", "max_link_width", "current_link_speed", "current_link_width")


def guest_views(host, bdfs: list[str]) -> dict[str, GuestView]:
    """Read each function's sysfs attributes and `lspci -vvv` in the guest (one agent call)."""
    for bdf in bdfs:
        if not BDF_RE.match(bdf):
            raise ValueError(f"not a PCI address: {bdf!r}")
    script = "".join(
        f"d=/sys/bus/pci/devices/{bdf}; echo '@@device {bdf}'; "
        f"for f in {' '.join(_SYSFS_ATTRS)}; do echo \"@attr $f=$(cat $d/$f 2>/dev/null)\"; done; "
        "echo \"@driver $(basename \"$(readlink $d/driver 2>/dev/null)\" 2>/dev/null)\"; "
        "sed 's/^/@resource /' $d/resource; "
        f"lspci -vvv -s {bdf} | sed 's/^/@lspci /'; "
        for bdf in bdfs
    )
    result = host.shell(script, timeout_s=60)
    if result.exit_code != 0:
        raise InfrastructureError(f"reading sysfs/lspci in the guest failed: exit {result.exit_code} "
                                  f"{result.stderr.strip()[:500]}")
    views: dict[str, GuestView] = {}
    current: GuestView | None = None
    lspci: list[str] = []
    for line in result.stdout.splitlines():
        if line.startswith("@@device "):
            if current is not None:
                current.lspci = "\n".join(lspci)
            current, lspci = GuestView(line.split()[1]), []
            views[current.bdf] = current
        elif current is None:
            continue
        elif line.startswith("@attr "):
            name, _, value = line[6:].partition("=")
            current.attrs[name] = value.strip()
        elif line.startswith("@driver"):
            current.driver = line[7:].strip() or None
        elif line.startswith("@resource "):
            current.resources.append(tuple(int(x, 16) for x in line.split()[1:4]))
        elif line.startswith("@lspci "):
            lspci.append(line[7:])
        elif line.startswith("@lspci"):
            lspci.append("")
    if current is not None:
        current.lspci = "\n".join(lspci)
    unread = [b for b in bdfs if b not in views or views[b].hex_attr("vendor") is None
              or not views[b].lspci.strip()]
    if unread:
        raise InfrastructureError(f"the guest reader (sysfs, lspci) returned nothing for {unread}")
    return views




def bare_interpreter_start(host, runtime_pid: int) -> tuple[int, int]:
    """DISC-03's floor: a bare `python3` importing pyudev (the runtime's one dependency), timed
    by itself from its process start on the node, so a slow test bed's interpreter start is not
    read as the runtime's cold discovery. The runtime (`runtime_pid`) is held stopped meanwhile: a
    runtime that keeps the node's CPU busy must not slow, and so inflate, its own floor."""
    return bare_python_start(host, ("pyudev",), paused_pid=runtime_pid)


# -- profile ---------------------------------------------------------------------------------------

def empty_slots(host) -> list:
    return [s for s in host.profile.slots if not s.populated]


def empty_slot(host):
    """The profile's first empty hot-plug slot (skips the test when it has none)."""
    slots = empty_slots(host)
    if not slots:
        pytest.skip(f"profile {host.profile.name} has no empty hot-plug slot")
    return slots[0]
