"""Fault capabilities of model slots vs stock slots (no VM: the profile decides)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hilconform.emulators.errors import FaultError
from hilconform.emulators.faults import MODEL_CAPABILITIES, QUEUE_CAPABILITIES, FaultInjector
from hilconform.emulators.profile import load_profile


def _injector(profile_name: str) -> FaultInjector:
    return FaultInjector(SimpleNamespace(profile=load_profile(profile_name)))


def test_model_slots_have_the_model_knobs_and_no_io_errors():
    faults = _injector("a100")
    for slot in ("gpu0", "gpu1", "spare0"):  # spare0: what a hot-add puts there
        caps = faults.slot_capabilities(slot)
        assert MODEL_CAPABILITIES <= caps, caps
        assert "queue-error" not in caps
        assert {"hot-add", "orderly-removal", "aer-fatal", "config-loss"} <= caps
    faults.require("fell-off-bus", "gpu0")
    with pytest.raises(FaultError, match="queue-error: slot gpu0 of host a100 "):
        faults.require("queue-error", "gpu0")


def test_stock_slots_have_no_model_only_faults():
    faults = _injector("a100-stock")
    caps = faults.capabilities
    assert QUEUE_CAPABILITIES <= caps
    for only_models in ("fell-off-bus", "firmware-mismatch", "link-degrade"):
        assert only_models not in caps
        with pytest.raises(FaultError, match=only_models):
            faults.require(only_models)


def test_fpga_models_host_offers_the_knobs_on_both_kinds():
    faults = _injector("mixed")
    assert all(MODEL_CAPABILITIES <= faults.slot_capabilities(s.name) for s in faults.vm.profile.slots)
