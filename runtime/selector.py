"""Which PCI functions the runtime manages: by class prefix and/or vendor:device."""

from __future__ import annotations

import re
from dataclasses import dataclass

_CLASS_RE = re.compile(r"^(\*|[0-9a-f]{2}|[0-9a-f]{4}|[0-9a-f]{6})$")
_ID_RE = re.compile(r"^[0-9a-f]{4}:([0-9a-f]{4}|\*)$")
_KEYS = ("classes", "ids")


@dataclass(frozen=True)
class Selector:
    """A device is selected when its 24-bit class starts with one of ``classes``
    (hex prefixes of 2, 4 or 6 digits: "01", "0108", "010802"; "*" = any class)
    or its IDs equal one of ``ids`` ("1b36:0010"; "10de:*" = any device of the
    vendor). An empty selector selects nothing. Hex is compared lowercase.
    """

    classes: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "classes", tuple(c.lower() for c in self.classes))
        object.__setattr__(self, "ids", tuple(i.lower() for i in self.ids))
        for c in self.classes:
            if not _CLASS_RE.match(c):
                raise ValueError(f"selector 'classes': {c!r} is not a 2/4/6-digit hex class prefix or '*'")
        for i in self.ids:
            if not _ID_RE.match(i):
                raise ValueError(f"selector 'ids': {i!r} is not 'vvvv:dddd' (or 'vvvv:*') in hex")

    def matches(self, vendor_id: int, device_id: int, class_code: int) -> bool:
        klass = f"{class_code & 0xFFFFFF:06x}"
        if any(c == "*" or klass.startswith(c) for c in self.classes):
            return True
        vendor = f"{vendor_id & 0xFFFF:04x}"
        return any(i in (f"{vendor}:{device_id & 0xFFFF:04x}", f"{vendor}:*") for i in self.ids)

    @classmethod
    def from_config(cls, table: dict) -> Selector:
        """From a TOML table {"classes": [...], "ids": [...]}; ValueError names what is bad."""
        if not isinstance(table, dict):
            raise ValueError(f"selector must be a table, not {type(table).__name__}")
        for key in table:
            if key not in _KEYS:
                raise ValueError(f"selector: unknown key {key!r} (known: {', '.join(_KEYS)})")
        values = {}
        for key in _KEYS:
            value = table.get(key, [])
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise ValueError(f"selector {key!r} must be a list of strings")
            if not all(isinstance(v, str) for v in value):
                raise ValueError(f"selector {key!r} must be a list of strings")
            values[key] = tuple(value)
        if not values["classes"] and not values["ids"]:
            raise ValueError("selector: give 'classes' and/or 'ids' (an empty selector manages nothing)")
        return cls(**values)
