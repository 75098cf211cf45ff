"""DISC-01 boot inventory: every endpoint present when the runtime starts is reported with
the ground truth's BDF, IDs, class, BARs, capabilities, link and bound driver.

The runtime's `inventory` is compared with readers that share no code with it: on every
host, the node's kernel (sysfs attributes and pciutils' `lspci -vvv`, run on the node: the
emulated guest through its agent, a real host over its shell), for the managed set the host
names (`host.managed_truth()`: the profile's selection); where the host is a QEMU VM, also
QEMU's own bus tree (QMP `query-pci`), a view from outside the guest.
"""

from __future__ import annotations

import pytest
from discovery_support import expected_managed, guest_views

pytestmark = pytest.mark.clause("DISC-01")


def _hex(value: int | None, digits: int = 4) -> str | None:
    return None if value is None else f"{value:0{digits}x}"


class Mismatches:
    def __init__(self):
        self.lines: list[str] = []

    def check(self, bdf: str, what: str, runtime_value, truth_value, source: str) -> None:
        if runtime_value != truth_value:
            self.lines.append(f"{bdf} {what}: runtime says {runtime_value!r}, {source} says {truth_value!r}")

    def __bool__(self) -> bool:
        return bool(self.lines)

    def text(self) -> str:
        return "\n  ".join(self.lines)


def _compare_with_qemu(bad: Mismatches, info: dict, fn) -> None:
    bdf = info["bdf"]
    bad.check(bdf, "vendor_id", info["vendor_id"], _hex(fn.vendor_id), "query-pci")
    bad.check(bdf, "device_id", info["device_id"], _hex(fn.device_id), "query-pci")
    bad.check(bdf, "subsystem_vendor_id", info["subsystem_vendor_id"], _hex(fn.subsystem_vendor_id),
              "query-pci")
    bad.check(bdf, "subsystem_id", info["subsystem_id"], _hex(fn.subsystem_id), "query-pci")
    bad.check(bdf, "class (class+subclass)", info["class_code"][:4], _hex(fn.class_code16), "query-pci")
    runtime_bars = {b["index"]: {k: b[k] for k in ("size", "kind", "prefetchable", "address")}
                    for b in info["bars"]}
    bad.check(bdf, "BARs", runtime_bars, fn.bars, "query-pci")


def _compare_with_guest(bad: Mismatches, info: dict, view) -> None:
    bdf = info["bdf"]
    sysfs = "guest sysfs"
    bad.check(bdf, "vendor_id", info["vendor_id"], _hex(view.hex_attr("vendor")), sysfs)
    bad.check(bdf, "device_id", info["device_id"], _hex(view.hex_attr("device")), sysfs)
    bad.check(bdf, "subsystem_vendor_id", info["subsystem_vendor_id"],
              _hex(view.hex_attr("subsystem_vendor")), sysfs)
    bad.check(bdf, "subsystem_id", info["subsystem_id"], _hex(view.hex_attr("subsystem_device")), sysfs)
    bad.check(bdf, "class_code", info["class_code"], _hex(view.hex_attr("class"), 6), sysfs)
    bad.check(bdf, "revision", info["revision"], _hex(view.hex_attr("revision"), 2), sysfs)
    runtime_bars = {b["index"]: {k: b[k] for k in ("size", "kind", "prefetchable", "address")}
                    for b in info["bars"]}
    bad.check(bdf, "BARs", runtime_bars, view.bars(), f"{sysfs} resource")
    bad.check(bdf, "driver", info["driver"], view.driver, f"{sysfs} driver link")
    bad.check(bdf, "driver", info["driver"], view.lspci_driver(), "lspci")

    caps, lspci = info["capabilities"], view.lspci_capabilities()
    for name in ("pcie", "pm", "msi", "msix", "aer", "flr", "dsn", "pcie_version", "port_type",
                 "msix_enabled", "msix_table_size", "msi_enabled", "msi_vectors"):
        bad.check(bdf, f"capabilities.{name}", caps.get(name), lspci[name], "lspci -vvv")
    bad.check(bdf, "number of standard capabilities", len(caps.get("standard", [])),
              lspci["standard_count"], "lspci -vvv")
    bad.check(bdf, "number of extended capabilities", len(caps.get("extended", [])),
              lspci["extended_count"], "lspci -vvv")

    link = {k: info["link"].get(k) for k in ("cap_speed_gts", "cap_width", "speed_gts", "width")}
    if not info["link"]:
        link = {}
    bad.check(bdf, "link", link, view.sysfs_link(), f"{sysfs} max/current_link_*")
    bad.check(bdf, "link", link, view.lspci_link(), "lspci LnkCap/LnkSta")
    if link:
        trained = bool(view.sysfs_link().get("width"))
        bad.check(bdf, "link.active", info["link"].get("active"), trained, f"{sysfs} current_link_width")
    if view.physical_slot() is not None:
        bad.check(bdf, "slot", info["slot"], view.physical_slot(), "lspci Physical Slot")


def _settled_listing(host, truth) -> dict[str, dict]:
    inventory = host.settled_inventory()
    assert inventory["complete"] is True
    assert truth, f"profile {host.profile.name} puts no managed device on the host: nothing to check"
    listed = {d["device"]: d for d in inventory["devices"]}
    assert set(listed) == set(truth), (
        f"runtime inventory lists {sorted(listed)}; the host's managed endpoints are {sorted(truth)}")
    for bdf, record in listed.items():
        assert (record["device"], record["info"]["bdf"]) == (bdf, bdf), f"record of {bdf}: {record}"
    return listed


def test_boot_inventory_matches_the_node_kernel(host):
    truth = host.managed_truth()
    listed = _settled_listing(host, truth)
    views = guest_views(host, sorted(truth))
    bad = Mismatches()
    for bdf, record in listed.items():
        _compare_with_guest(bad, record["info"], views[bdf])
    assert not bad, "runtime inventory differs from the node's kernel:\n  " + bad.text()
    assert host.runtime.violations == []


@pytest.mark.needs("qmp")  # the ground truth is QEMU's own bus tree
def test_boot_inventory_matches_qemu(host):
    truth = expected_managed(host)
    assert set(truth) == set(host.managed_truth()), (
        f"QEMU's managed endpoints {sorted(truth)} differ from the host's {sorted(host.managed_truth())}")
    listed = _settled_listing(host, truth)
    bad = Mismatches()
    for bdf, record in listed.items():
        _compare_with_qemu(bad, record["info"], truth[bdf])
    assert not bad, "runtime inventory differs from QEMU's bus tree:\n  " + bad.text()
    assert host.runtime.violations == []
