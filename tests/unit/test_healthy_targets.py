"""healthy_targets passes over a device earlier tests left unwell (a real host keeps their effects)
and names every device's state when too few are left."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hilconform.fixtures.runtime_waits import healthy_targets


def _host(states: dict[str, tuple[str, str | None]]):
    records = {bdf: {"device": bdf, "state": state, "lease": lease, "busy": None, "last_cause": "boot"}
               for bdf, (state, lease) in states.items()}
    runtime = SimpleNamespace(call=lambda method, params: records[params["device"]])
    return SimpleNamespace(
        runtime=runtime,
        settled_inventory=lambda: {"devices": list(records.values())},
        targets=lambda capability: list(records),
        target_bdf=lambda target: target,
    )


def test_a_degraded_or_held_device_is_passed_over():
    host = _host({"0000:01:00.0": ("DEGRADED", None), "0000:02:00.0": ("HEALTHY", "L7"),
                  "0000:03:00.0": ("HEALTHY", None), "0000:04:00.0": ("HEALTHY", None)})
    chosen = healthy_targets(host, "aer-fatal", 2)
    assert [t for t, _ in chosen] == ["0000:03:00.0", "0000:04:00.0"]


def test_too_few_skips_naming_the_others():
    host = _host({"0000:01:00.0": ("DEGRADED", None), "0000:03:00.0": ("HEALTHY", None)})
    expected = r"2 HEALTHY free device\(s\).*1 found.*0000:01:00.0.*DEGRADED"
    with pytest.raises(pytest.skip.Exception, match=expected):
        healthy_targets(host, "aer-nonfatal", 2)
