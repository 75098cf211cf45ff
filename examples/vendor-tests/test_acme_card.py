"""Two tests ACME would write for its own card with hilconform's fixtures: the host (emulated or
a real lab machine, chosen by --host), its runtime client, its ground truth and budgets."""

from __future__ import annotations

import time

import pytest


@pytest.mark.clause("ACME-01")
def test_inventory_lists_every_card_with_its_config_space_ids(host, measurements, clause_budgets):
    managed = host.managed_truth()  # the profile's managed cards, by BDF
    truth = {fn.bdf: fn for fn in host.ground_truth() if fn.bdf in managed}  # the node's own view
    host.settled_inventory()
    started = time.monotonic()
    inventory = host.runtime.call("inventory")
    answered_ms = (time.monotonic() - started) * 1000
    listed = {record["device"]: record["info"] for record in inventory["devices"]}
    assert sorted(listed) == sorted(truth), f"the runtime lists {sorted(listed)}; the node: {sorted(truth)}"
    for bdf, fn in truth.items():
        said = (listed[bdf]["vendor_id"], listed[bdf]["device_id"])
        assert said == (f"{fn.vendor_id:04x}", f"{fn.device_id:04x}"), f"{bdf}: the runtime says {said}"
    figure = measurements.record("ACME-01", "inventory_answer", [answered_ms], "ms",
                                 budget=clause_budgets["inventory_answer_ms"], budget_stat="max")
    assert figure.within_budget, figure.text()


@pytest.mark.clause("ACME-02")
def test_fingerprints_survive_a_runtime_restart(host, clause_budgets):
    before = {d["device"]: d["fingerprint"] for d in host.settled_inventory()["devices"]}
    assert before, "no managed card to check"
    started = time.monotonic()
    host.restart_runtime()
    after = {d["device"]: d["fingerprint"] for d in host.settled_inventory()["devices"]}
    took_s = time.monotonic() - started
    assert after == before, f"fingerprints changed across the restart: {before} -> {after}"
    budget_s = clause_budgets["restart_to_inventory_s"]
    assert took_s <= budget_s, f"restart to a complete inventory: {took_s:.1f} s (budget {budget_s:g} s)"
