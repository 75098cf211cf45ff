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
