"""emulators/slot_units: the unit backend per slot (stand-in or device model), checked against a
QMP stand-in that records commands (no VM). The suites rely on these answers instead of asking
which kind stands in a slot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hilconform.emulators.errors import FaultError
from hilconform.emulators.profile import load_profile
from hilconform.emulators.slot_units import ModelUnit, StandInUnit, slot_unit


class RecordingQmp:
    def __init__(self, answers: dict | None = None):
        self.sent: list[tuple[str, dict | None]] = []
        self.answers = answers or {}
        self.nodes: list[dict] = []

    def execute(self, command: str, arguments: dict | None = None):
        self.sent.append((command, arguments))
        if command == "query-named-block-nodes":
            return self.nodes
        if command == "blockdev-add":
            self.nodes.append({"node-name": arguments["node-name"]})
            return {}
        if command == "qom-get":
            return self.answers[(arguments["path"].rsplit("/", 1)[1], arguments["property"])]
        return {}


def _vm(profile_name: str, qmp: RecordingQmp) -> SimpleNamespace:
    return SimpleNamespace(profile=load_profile(profile_name), qmp=qmp)


def test_a_stock_queue_slot_is_a_stand_in_with_a_serial_on_its_block_node():
    qmp = RecordingQmp({("gpu0", "drive"): "q-gpu0", ("gpu0", "serial"): "HILC-GPU0"})
    unit = slot_unit(_vm("a100-stock", qmp), "gpu0")
    assert isinstance(unit, StandInUnit) and unit.has_identity
    assert unit.identity("gpu0") == "HILC-GPU0"
    assert unit.identity_text("HILC-GPU0") == "HILC-GPU0"
    assert unit.reported_identity({"info": {"serial": "HILC-GPU0"}}) == "HILC-GPU0"
    props = unit.add_properties("gpu0-unit1", unit.other_identity("HILC-GPU0", 1))
    assert props["drive"] == "q-gpu0"  # another unit on the same block node
    assert props["serial"] == "GPU0-OTHER1" and props["bus"] == unit.slot.port_id


def test_a_storm_unit_gets_one_null_block_node_made_before_its_device_add():
    qmp = RecordingQmp()
    unit = slot_unit(_vm("a100-stock", qmp), "spare0")
    first = unit.add_properties("storm0-spare0", medium="null")
    second = unit.add_properties("storm1-spare0", medium="null")
    assert first["drive"] == second["drive"] == "null-spare0"
    assert [c for c, _ in qmp.sent].count("blockdev-add") == 1
    assert not any(c == "device_add" for c, _ in qmp.sent)  # the caller times the device_add itself


def test_a_device_model_slot_reports_its_dsn_as_lspci_shows_it():
    unit = slot_unit(_vm("a100", RecordingQmp()), "gpu0")
    assert isinstance(unit, ModelUnit) and unit.has_identity
    assert unit.identity_text(0x0102030405060708) == "01-02-03-04-05-06-07-08"
    assert unit.reported_identity({"info": {"capabilities": {"dsn": "01-02"}}}) == "01-02"
    assert unit.other_identity(0x10, 2) == 0x10 ^ (2 << 24)


def test_an_unknown_slot_is_refused_naming_it():
    with pytest.raises(FaultError, match="no slot 'gpu9'"):
        slot_unit(_vm("a100-stock", RecordingQmp()), "gpu9")
