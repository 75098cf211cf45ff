"""The self-check wait (fixtures/runtime_waits.py, every suite's) tells a hot-add the guest
undid itself (QEMU's attention button taken for a power-off request) from a runtime whose
self-check never ends: the first is a test-bed error (InfrastructureError, within a slice),
the second a timeout naming what was awaited."""

from __future__ import annotations

import pytest

from hilconform.fixtures import runtime_waits
from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.runtime_client import RuntimeUnresponsive

BDF = "0000:03:00.0"


class _Runtime:
    """Events recorded so far; no procedure end ever comes."""

    def __init__(self, events: list[dict]):
        self._events = events
        self.waits = 0

    def events(self, after: int = 0, name: str | None = None) -> list[dict]:
        return [e for e in self._events[after:] if name is None or e["event"] == name]

    def wait_event(self, name, after, timeout_s, match=None, what=""):
        self.waits += 1
        raise RuntimeUnresponsive(f"runtime event {name} ({what}) did not arrive within {timeout_s:.1f}s")


def _discovered(slot: str) -> dict:
    return {"event": "discovered", "data": {"device": BDF, "info": {"slot": slot}}}


def _power_off(slot: str) -> dict:
    line = f"pcieport 0000:00:12.0: pciehp: Slot({slot}): Powering off due to button press"
    return {"event": "kernel", "data": {"kind": "button_power_off", "slot": slot, "line": line}}


def test_a_guest_power_off_of_the_added_slot_voids_the_add_at_the_first_slice():
    runtime = _Runtime([_discovered("3"), _power_off("3")])
    with pytest.raises(InfrastructureError, match="attention button"):
        runtime_waits.wait_self_check_end(runtime, BDF, 0, timeout_s=30)
    assert runtime.waits == 1


def test_a_power_off_elsewhere_leaves_a_plain_timeout():
    runtime = _Runtime([_discovered("3"), _power_off("4")])
    with pytest.raises(RuntimeUnresponsive, match=f"hot-add self-check of {BDF} ends"):
        runtime_waits.wait_self_check_end(runtime, BDF, 0, timeout_s=0.1)
