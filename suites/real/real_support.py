"""Helpers of the real-host suite: link figures from sysfs, REAL-01 findings.

Readers here share no code with the runtime: the kernel's sysfs (through the
host's shell) and pciutils are the ground truth the runtime is judged against.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

LINK_SEVERITY = tomllib.loads(Path(__file__).with_name("real01_link_severity.toml").read_text())
# sysfs current_link_speed "8.0 GT/s PCIe" -> PCIe generation
GENERATION_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def gts(sysfs_speed: str | None) -> float | None:
    """"8.0 GT/s PCIe" -> 8.0; None for "Unknown" or a missing attribute."""
    if not sysfs_speed:
        return None
    head = sysfs_speed.split()[0]
    try:
        return float(head)
    except ValueError:
        return None


def width(sysfs_width: str | None) -> int | None:
    try:
        return int(sysfs_width) if sysfs_width else None
    except ValueError:
        return None


@dataclass(frozen=True)
class LinkFinding:
    device: str
    kind: str
    severity: str
    text: str

    def as_dict(self) -> dict:
        return {"device": self.device, "kind": self.kind, "severity": self.severity, "text": self.text}


def severity_rank(severity: str) -> int:
    return LINK_SEVERITY["order"].index(severity)


def link_findings(bdf: str, record: dict, minimum) -> list[LinkFinding]:
    """REAL-01 findings for one device's sysfs record against the profile's minimum."""
    table = LINK_SEVERITY["severity"]
    speed, lanes = gts(record.get("current_link_speed")), width(record.get("current_link_width"))
    cap_speed, cap_lanes = gts(record.get("max_link_speed")), width(record.get("max_link_width"))

    def finding(kind: str, text: str) -> LinkFinding:
        return LinkFinding(bdf, kind, table[kind], text)

    if record.get("current_link_speed") is None and record.get("current_link_width") is None:
        return [finding("not_pcie", f"{bdf}: no PCIe link at all (no current_link_* in sysfs)")]
    if speed is None or not lanes:
        return [finding("not_trained", f"{bdf}: link not trained (speed "
                                       f"{record.get('current_link_speed')!r}, width "
                                       f"{record.get('current_link_width')!r})")]
    out = []
    generation = GENERATION_OF_GTS.get(speed)
    if generation is None:
        out.append(finding("unknown_speed", f"{bdf}: link speed {speed} GT/s matches no PCIe generation"))
    elif generation < minimum.generation:
        out.append(finding("below_minimum_generation",
                           f"{bdf}: link runs Gen{generation} ({speed} GT/s), the model needs {minimum}"))
    if lanes < minimum.width:
        out.append(finding("below_minimum_width", f"{bdf}: link runs x{lanes}, the model needs {minimum}"))
    if not out and ((cap_speed and speed < cap_speed) or (cap_lanes and lanes < cap_lanes)):
        out.append(finding("below_device_capability",
                           f"{bdf}: link runs {speed} GT/s x{lanes}, below the device's own "
                           f"{cap_speed} GT/s x{cap_lanes} (still meets {minimum})"))
    return out


def link_disagreement(bdf: str, record: dict, inventory: dict[str, dict]) -> str | None:
    """Why the runtime's reported link differs from the sysfs record, or None when they agree."""
    if bdf not in inventory:
        return f"{bdf}: the runtime does not list it"
    link = inventory[bdf].get("info", {}).get("link") or {}
    runtime_view = (link.get("speed_gts"), link.get("width"))
    sysfs_view = (gts(record.get("current_link_speed")), width(record.get("current_link_width")))
    if runtime_view != sysfs_view:
        return (f"{bdf}: runtime reports {runtime_view[0]} GT/s x{runtime_view[1]}, "
                f"sysfs says {sysfs_view[0]} GT/s x{sysfs_view[1]}")
    return None


def failing(findings: list[LinkFinding]) -> list[LinkFinding]:
    threshold = severity_rank(LINK_SEVERITY["fail_at"])
    return [f for f in findings if severity_rank(f.severity) >= threshold]
