"""DISC-01 on a real host: the runtime's boot inventory matches the host kernel and pciutils.

Ground truth on a real host is sysfs (read by `fixtures/real_probe.py` on the
host) and `lspci -D -n`; the managed set is every function whose IDs the
real-host profile selects. Each runtime record must carry sysfs's IDs,
subsystem IDs, class, revision, bound driver and link, and lspci must list the
same functions with the same IDs and class.
"""

from __future__ import annotations

import pytest
from real_support import gts, width

pytestmark = [pytest.mark.clause("DISC-01"), pytest.mark.needs("real-host")]


def _hex(sysfs_value: str | None, digits: int) -> str | None:
    return None if sysfs_value is None else f"{int(sysfs_value, 16):0{digits}x}"


def test_boot_inventory_matches_sysfs_and_lspci(host):
    truth = host.managed_truth()
    inventory = host.settled_inventory()
    assert inventory["complete"] is True
    assert truth, f"profile {host.profile.name} selects no device on the host"
    listed = {d["device"]: d["info"] for d in inventory["devices"]}
    assert set(listed) == set(truth), (
        f"runtime lists {sorted(listed)}; sysfs has the selected functions {sorted(truth)}")
    lspci = {f.bdf: f for f in host.guest_pci()}
    bad = []
    for bdf, record in sorted(truth.items()):
        info = listed[bdf]
        expected = {
            "vendor_id": _hex(record["vendor"], 4), "device_id": _hex(record["device"], 4),
            "subsystem_vendor_id": _hex(record["subsystem_vendor"], 4),
            "subsystem_id": _hex(record["subsystem_device"], 4),
            "class_code": _hex(record["class"], 6), "revision": _hex(record["revision"], 2),
            "driver": record["driver"],
        }
        for key, value in expected.items():
            if info.get(key) != value:
                bad.append(f"{bdf} {key}: runtime says {info.get(key)!r}, sysfs says {value!r}")
        if record["current_link_width"] is not None:
            link = info.get("link") or {}
            sysfs_link = (gts(record["current_link_speed"]), width(record["current_link_width"]),
                          gts(record["max_link_speed"]), width(record["max_link_width"]))
            runtime_link = (link.get("speed_gts"), link.get("width"), link.get("cap_speed_gts"),
                            link.get("cap_width"))
            if runtime_link != sysfs_link:
                bad.append(f"{bdf} link (speed, width, cap speed, cap width): runtime says {runtime_link}, "
                           f"sysfs says {sysfs_link}")
        fn = lspci.get(bdf)
        if fn is None:
            bad.append(f"{bdf}: lspci does not list it")
        elif (f"{fn.vendor_id:04x}", f"{fn.device_id:04x}", f"{fn.class_code:04x}") != (
                expected["vendor_id"], expected["device_id"], expected["class_code"][:4]):
            bad.append(f"{bdf}: lspci says {fn.ids} class {fn.class_code:04x}, sysfs {expected}")
    assert not bad, "runtime inventory differs from the host's ground truth:\n  " + "\n  ".join(bad)
    assert host.runtime.violations == []
