"""The Linux drivers a device model may name, and the emulated IOMMU some of them need.

Data (guest_drivers.toml) read by two sides: model.py checks a model's `guest_driver`
field against it, guest_driver.py binds the named driver in the guest. It lives apart
from both so neither has to import the other.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class GuestDriver:
    name: str
    modules: tuple[tuple[str, ...], ...]  # (module, option, ...) in load order
    needs_iommu: bool


@cache
def _table() -> dict:
    return tomllib.loads(resources.files(__package__).joinpath("guest_drivers.toml").read_text())


def guest_drivers() -> dict[str, GuestDriver]:
    """The drivers a model may name, by name."""
    return {name: GuestDriver(name, tuple(tuple(m) for m in raw["modules"]), bool(raw["needs_iommu"]))
            for name, raw in _table()["drivers"].items()}


def iommu() -> dict:
    """The emulated IOMMU: its QEMU `-device` properties (`device`) and guest `kernel_args`."""
    return _table()["iommu"]
