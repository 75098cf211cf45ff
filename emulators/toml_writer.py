"""Writing TOML: the one writer of every runtime configuration the harness hands a runtime.

Python has a TOML reader (tomllib) and no writer; the configurations the harness writes hold only
tables of strings, numbers, booleans and lists of them, so this writes exactly that and refuses
anything else rather than guess. `merge_tables` is how a test changes a configuration: a deep
merge, so `{"aer": {"fault_weight": 4.0}}` changes one key of one table and keeps the rest.
"""

from __future__ import annotations

import json
import math
import re

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value, where: str) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} has no TOML form here")
    if isinstance(value, bool | int | float | str):
        return json.dumps(value)  # JSON's strings, numbers and booleans are TOML's
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v, where) for v in value) + "]"
    raise ValueError(f"{where}: a {type(value).__name__} is not a TOML value this writer makes")


def dump_toml(data: dict, header: str = "", _prefix: str = "") -> str:
    """`data` as TOML text: plain keys first, then each nested dict as a table (`[a.b]`);
    `header`, if given, as a leading comment."""
    lines = [f"# {line}" for line in header.splitlines()]
    if _prefix:
        lines.append(f"[{_prefix}]")
    nested = []
    for key, value in data.items():
        if isinstance(value, dict):
            nested.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value, f'{_prefix}.{key}'.lstrip('.'))}")
    text = "\n".join(lines) + "\n" if lines else ""
    for key, value in nested:
        text += "\n" + dump_toml(value, "", f"{_prefix}.{_key(key)}" if _prefix else _key(key))
    return text


def merge_tables(base: dict, changes: dict) -> dict:
    """`base` with `changes` merged in, table by table (neither is modified)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = value
    return out
