"""REAL-01, emulated twin: device models' negotiated links meet their real cards' minimum.

The same check as test_real01_link.py (findings and severities from
`real01_link_severity.toml`, the runtime's reported link must equal sysfs), on a
device-model host: the ground truth is the guest kernel's sysfs
`current_link_speed/width` of every managed model, and each model is held to the
minimum of the real-host profile naming its IDs (A100 Gen3 x16, T4 Gen3 x8,
Alveo U250 Gen3 x16). Models train at their card's capability; the second test
lowers one model's Link Status below the minimum (the link-degraded knob) and
the check must report a major finding, which fails the clause, with the runtime
reporting the degraded link. The runtime reads a link when it discovers the
device (a retrained link raises no event it could see), so it is restarted after
the degradation, as it would start on a host whose card trained low.
Stock hosts (nvme/edu at 2.5 GT/s x1) and real hosts skip with the reason.
"""

from __future__ import annotations

import json

import pytest
from model_link_support import below, guest_link_record, managed_models, real_minimum, require_model_host
from real_support import failing, gts, link_disagreement, link_findings, width

from hilconform.fixtures.errors import InfrastructureError

pytestmark = pytest.mark.clause("REAL-01")


def test_model_links_meet_the_real_cards_minimum(host_factory, request):
    require_model_host(host_factory)
    host = request.getfixturevalue("host")
    models = managed_models(host)
    inventory = {d["device"]: d for d in host.settled_inventory()["devices"]}
    findings, disagreements, minima = [], [], {}
    for model in models:
        minimum = real_minimum(model.ids)
        minima[model.bdf] = str(minimum)
        record = guest_link_record(host, model.bdf)
        findings += link_findings(model.bdf, record, minimum)
        why = link_disagreement(model.bdf, record, inventory)
        if why:
            disagreements.append(why)
    request.node.user_properties.append(("real01_minimum", json.dumps(minima)))
    request.node.user_properties.append(("real01_findings", json.dumps([f.as_dict() for f in findings])))
    assert not disagreements, "runtime link differs from sysfs:\n  " + "\n  ".join(disagreements)
    bad = failing(findings)
    assert not bad, "links below the real card's minimum:\n  " + "\n  ".join(
        f"[{f.severity}] {f.text}" for f in bad)


@pytest.mark.destructive
@pytest.mark.needs("link-degrade")
def test_model_link_below_the_minimum_is_a_major_finding(host_factory, request):
    require_model_host(host_factory)
    host = request.getfixturevalue("host")
    models = managed_models(host)
    degraded, others = models[0], models[1:]
    minimum = real_minimum(degraded.ids)
    speed, lanes = below(minimum)
    host.get("link-degrade").degrade_link(degraded.slot, speed, lanes)
    host.restart_runtime()
    inventory = {d["device"]: d for d in host.settled_inventory()["devices"]}

    record = guest_link_record(host, degraded.bdf)
    trained = (gts(record["current_link_speed"]), width(record["current_link_width"]))
    if trained != (float(speed.replace("_", ".")), lanes):
        raise InfrastructureError(f"{degraded.slot} ({degraded.bdf}): degraded to {speed} GT/s x{lanes} but "
                                  f"the guest's sysfs shows {record}")
    findings = link_findings(degraded.bdf, record, minimum)
    request.node.user_properties.append(("real01_minimum", str(minimum)))
    request.node.user_properties.append(("real01_findings", json.dumps([f.as_dict() for f in findings])))
    why = link_disagreement(degraded.bdf, record, inventory)
    assert why is None, f"the runtime does not report the degraded link: {why}"
    assert {(f.kind, f.severity) for f in findings} == {
        ("below_minimum_generation", "major"), ("below_minimum_width", "major")}, (
        f"a {speed} GT/s x{lanes} link against {minimum}: {[f.as_dict() for f in findings]}")
    assert failing(findings) == findings, "a major link finding must fail REAL-01"

    for model in others:  # the degradation stays on its own card
        other = guest_link_record(host, model.bdf)
        assert not failing(link_findings(model.bdf, other, real_minimum(model.ids))), (model, other)
        assert link_disagreement(model.bdf, other, inventory) is None, (model, other, inventory[model.bdf])
