"""REAL-01: every profile-selected device's negotiated link meets the model's minimum.

Ground truth: the host kernel's sysfs `current_link_speed/width` (and
`max_link_*` for the device's own capability), read on the host. The runtime's
reported link must agree with it, and each shortfall is a finding with an
explicit severity (`real01_link_severity.toml`): below the model's minimum
generation or width is major (fails), an untrained link critical (fails), a
link slower than the card's own capability but at the minimum minor (recorded).
On emulated device-model hosts the same check runs as a twin:
test_real01_model_link.py.
"""

from __future__ import annotations

import json

import pytest
from real_support import failing, link_disagreement, link_findings

pytestmark = [pytest.mark.clause("REAL-01"), pytest.mark.needs("real-host")]


def test_negotiated_link_meets_the_model_minimum(host, request):
    truth = host.managed_truth()
    inventory = {d["device"]: d for d in host.settled_inventory()["devices"]}
    minimum = host.profile.link_min
    findings = [f for bdf, record in sorted(truth.items()) for f in link_findings(bdf, record, minimum)]
    disagreements = [why for bdf, record in sorted(truth.items())
                     if (why := link_disagreement(bdf, record, inventory))]
    request.node.user_properties.append(("real01_minimum", str(minimum)))
    request.node.user_properties.append(("real01_findings", json.dumps([f.as_dict() for f in findings])))
    assert truth, f"profile {host.profile.name} selects no device on the host"
    assert not disagreements, "runtime link differs from sysfs:\n  " + "\n  ".join(disagreements)
    bad = failing(findings)
    assert not bad, "links below the model's minimum:\n  " + "\n  ".join(
        f"[{f.severity}] {f.text}" for f in bad)
