"""REAL-01: every profile-selected device's negotiated link meets the model's minimum.

Ground truth: the host kernel's sysfs `current_link_speed/width` (and
`max_link_*` for the device's own capability), read on the host. The runtime's
reported link must agree with it, and each shortfall is a finding with an
explicit severity (`real01_link_severity.toml`): below the model's minimum
generation or width is major (fails), an untrained link critical (fails), a
link slower than the card's own capability but at the minimum minor (recorded).
"""

from __future__ import annotations

import json

import pytest
from real_support import failing, gts, link_findings, real_host_only, width

pytestmark = pytest.mark.clause("REAL-01")


def test_negotiated_link_meets_the_model_minimum(host, request):
    real_host_only(host)
    truth = host.managed_truth()
    inventory = {d["device"]: d for d in host.settled_inventory()["devices"]}
    minimum = host.profile.link_min
    findings, disagreements = [], []
    for bdf, record in sorted(truth.items()):
        findings += link_findings(bdf, record, minimum)
        link = inventory.get(bdf, {}).get("info", {}).get("link") or {}
        runtime_view = (link.get("speed_gts"), link.get("width"))
        sysfs_view = (gts(record["current_link_speed"]), width(record["current_link_width"]))
        if bdf not in inventory:
            disagreements.append(f"{bdf}: the runtime does not list it")
        elif runtime_view != sysfs_view:
            disagreements.append(f"{bdf}: runtime reports {runtime_view[0]} GT/s x{runtime_view[1]}, "
                                 f"sysfs says {sysfs_view[0]} GT/s x{sysfs_view[1]}")
    request.node.user_properties.append(("real01_minimum", str(minimum)))
    request.node.user_properties.append(("real01_findings", json.dumps([f.as_dict() for f in findings])))
    assert truth, f"profile {host.profile.name} selects no device on the host"
    assert not disagreements, "runtime link differs from sysfs:\n  " + "\n  ".join(disagreements)
    bad = failing(findings)
    assert not bad, "links below the model's minimum:\n  " + "\n  ".join(
        f"[{f.severity}] {f.text}" for f in bad)
