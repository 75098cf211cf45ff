"""Read a JSON file a run or a lab night wrote, turning what is wrong with it into the reader's own
error (one line naming the file), so that each record's reader only checks its content."""

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
