"""Reading the project's TOML data files (profiles, device models) with errors that name the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


def read_toml(path: Path, error: type[Exception], what: str) -> dict[str, Any]:
    """The parsed table of `path`; an unreadable or invalid file raises `error` naming it."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None


def check_entry(name: str, entry: Any, keys: dict[str, type], required: tuple[str, ...], where: str,
                error: type[Exception]) -> dict[str, Any]:
    """The table `[name]` of a data file, read strictly: not a table, an unknown key, a value of
    another type or a missing required key raises `error` naming the file, the table and the key."""
    if not isinstance(entry, dict):
        raise error(f"{where}: {name!r} is not a table")
    for key, value in entry.items():
        if key not in keys:
            raise error(f"{where}: [{name}] has unknown key {key!r} (known: {', '.join(keys)})")
        if not isinstance(value, keys[key]):
            raise error(f"{where}: [{name}] {key} must be a {keys[key].__name__}")
    for key in required:
        if key not in entry:
            raise error(f"{where}: [{name}] lacks {key!r}")
    return entry
