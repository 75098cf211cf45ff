"""Read a JSON file a run or a lab night wrote, and check a record against its schema, turning what
is wrong with either into the reader's own error (one line naming the file, and the key), so that
each record's reader says only which file and which schema."""

from __future__ import annotations

import json
from pathlib import Path


def read_json(path: Path, error: type[Exception]):
    """The parsed JSON of `path`; `error` naming the file when it is unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None


def check_schema(data, schema: dict, where: str, error: type[Exception]) -> None:
    """`error` naming `where` and the key (e.g. `hosts/0/verdict`) when `data` breaks `schema`."""
    import jsonschema

    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        at = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise error(f"{where} at {at}: {exc.message}") from None
