"""REAL-01 findings and severities from sysfs link records (no host needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hilconform.fixtures.real_profile import LinkMinimum

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "suites" / "real"))
from real_support import failing, link_findings  # noqa: E402

GEN3_X16 = LinkMinimum(3, 16)


def record(speed: str, width: str, cap_speed: str = "16.0 GT/s PCIe", cap_width: str = "16") -> dict:
    return {"current_link_speed": speed, "current_link_width": width,
            "max_link_speed": cap_speed, "max_link_width": cap_width}


@pytest.mark.parametrize("link, kinds, fails", [
    (record("16.0 GT/s PCIe", "16"), [], False),
    (record("8.0 GT/s PCIe", "16"), ["below_device_capability"], False),
    (record("5.0 GT/s PCIe", "16"), ["below_minimum_generation"], True),
    (record("16.0 GT/s PCIe", "8"), ["below_minimum_width"], True),
    (record("2.5 GT/s PCIe", "4"), ["below_minimum_generation", "below_minimum_width"], True),
    (record("Unknown", "0"), ["not_trained"], True),
    ({"current_link_speed": None, "current_link_width": None}, ["not_pcie"], True),
])
def test_each_link_gets_its_findings_and_severity(link, kinds, fails):
    findings = link_findings("0000:17:00.0", link, GEN3_X16)
    assert [f.kind for f in findings] == kinds
    assert bool(failing(findings)) is fails
    for f in findings:
        assert f.severity in ("minor", "major", "critical")


def test_a_t4_at_gen3_x8_meets_its_minimum():
    assert link_findings("0000:3b:00.0", record("8.0 GT/s PCIe", "8", "8.0 GT/s PCIe", "16"),
                         LinkMinimum(3, 8))[0].kind == "below_device_capability"
