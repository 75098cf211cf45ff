"""Mutant healthy_after_config_loss, breaks RST-03: a device with cleared BARs stays HEALTHY.

Plausible bug: the health checkpoint only asks "does config space answer?" (vendor ID
not all ones). After a reset behind the driver the IDs still read fine while the BARs
are cleared and MMIO is dead, so the device is reported HEALTHY and handed out.
"""

from __future__ import annotations

from hilconform.runtime import procedures
from hilconform.runtime.pciconfig import parse_config

from .launch import launch


def apply() -> None:
    def config_answers(sysfs, bdf: str, info) -> dict:
        try:
            present = parse_config(sysfs.read_config(bdf)).present
        except (OSError, ValueError) as exc:
            return {"name": "config_intact", "ok": False, "problems": [f"config unreadable: {exc}"]}
        problems = [] if present else ["config space reads all ones"]
        return {"name": "config_intact", "ok": not problems, "problems": problems}

    procedures.config_intact = config_answers


if __name__ == "__main__":
    launch("healthy_after_config_loss", apply)
