"""lab-run.json: what happened to each lab host in one night of `hilconform lab run`.

`lab run` writes it into the night's folder (NIGHT_DIR); `lab report` reads it to build the
fleet report. It is the only record of the hosts that never got as far as a run folder (held by
someone else, not reserved in time), so it is written and read strictly: an unknown or missing
key, a value of another type, an unknown status or a status that contradicts the other fields is
an error naming the file and the key, never a host silently left out of the fleet report.
The schema is documented in reports/lab-night.schema.json and docs/fleet-report.md.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from hilconform.fixtures.errors import BadInput

from .json_file import read_json
from .verdicts import EXIT_CODES, OVERALL_VERDICTS

NIGHT_FILE = "lab-run.json"
SCHEMA_VERSION = 1
KIND = "hilconform-lab-night"
SCHEMA_FILE = Path(__file__).with_name("lab-night.schema.json")

# What happened to a host this night. Only `certified` and `incomplete` hosts have a run folder
# and a verdict: an incomplete host's is whatever its certificate said, if it has one (the lab may
# have cut a run its certificate calls complete). An `error` host may have certify's exit code
# (certify refused to start, e.g. bad input); `held` and `not_reserved` hosts never ran it.
STATUSES = {
    "certified": "certify ran to its end; its verdict is the certificate's",
    "incomplete": "certify started, but the run broke or the host dropped off mid-run",
    "not_reserved": "the reservation of the place did not come within its deadline",
    "held": "someone else holds the place (the reason names the holder, e.g. ci-b/bob)",
    "error": "anything else before certify started (e.g. the place has no NetworkService)",
}
WITH_RUN_DIR = ("certified", "incomplete")
# ISO 8601 date and time with a zone, as the schema's `time` pattern says
TIME_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})")

# key -> the types it accepts; every key is required, none other is allowed; the order is the order written
NIGHT_KEYS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "kind": (str,),
    "coordinator": (str,),
    "tags": (dict,),
    "started": (str,),
    "ended": (str,),
    "hosts": (list,),
}
HOST_KEYS: dict[str, tuple[type, ...]] = {
    "place": (str,),
    "status": (str,),
    "reason": (str,),
    "run_dir": (str, type(None)),
    "verdict": (str, type(None)),
    "exit_code": (int, type(None)),
    "started": (str,),
    "ended": (str,),
}


class BadNight(BadInput):
    """A NIGHT_DIR or its lab-run.json is missing or does not match its schema."""


@dataclass(frozen=True)
class NightHost:
    """One place of the lab and what became of it this night. `run_dir` is relative to NIGHT_DIR."""

    place: str
    status: str
    reason: str
    run_dir: str | None
    verdict: str | None
    exit_code: int | None
    started: str
    ended: str


@dataclass(frozen=True, kw_only=True)
class Night:
    """One night of `hilconform lab run`: the coordinator and place tags it matched, and every host
    (keyword arguments only: the fields are many and alike)."""

    schema_version: int = SCHEMA_VERSION
    kind: str = KIND
    coordinator: str
    tags: dict[str, str]
    started: str
    ended: str
    hosts: list[NightHost] = field(default_factory=list)

    @property
    def started_at(self) -> datetime:
        """`started` as a datetime: nights are ordered by it."""
        return datetime.fromisoformat(self.started)

    def host(self, place: str) -> NightHost | None:
        return next((h for h in self.hosts if h.place == place), None)


def _type_names(types: tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", dict: "an object", list: "a list", type(None): "null"}
    return " or ".join(names[t] for t in types)


def _check_keys(entry: Any, keys: dict[str, tuple[type, ...]], where: str) -> dict:
    """`entry` as a dict of exactly `keys`, each of its type (a bool is not an integer here)."""
    if not isinstance(entry, dict):
        raise BadNight(f"{where}: must be an object")
    for key, value in entry.items():
        if key not in keys:
            raise BadNight(f"{where}: unknown key {key!r} (known: {', '.join(keys)})")
        if isinstance(value, bool) or not isinstance(value, keys[key]):
            raise BadNight(f"{where}: {key} must be {_type_names(keys[key])}, not {json.dumps(value)[:60]}")
    for key in keys:
        if key not in entry:
            raise BadNight(f"{where}: lacks {key!r}")
    return entry


def _check_time(value: str, where: str) -> None:
    """An ISO 8601 time with its time zone (nights from several machines must order correctly)."""
    if not TIME_PATTERN.fullmatch(value):
        raise BadNight(f"{where}: {value!r} is not an ISO 8601 time with a zone (e.g. 2026-12-04T01:00:00Z)")
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise BadNight(f"{where}: {value!r} is not a valid time") from None


def _check_run_dir(run_dir: str, where: str) -> None:
    """Relative to NIGHT_DIR and inside it: the report links to it and must not point elsewhere."""
    path = PurePosixPath(run_dir)
    if not run_dir or path.is_absolute() or ".." in path.parts or "\\" in run_dir:
        raise BadNight(f"{where}: run_dir {run_dir!r} must be a relative path inside NIGHT_DIR")


def _host(entry: Any, where: str) -> NightHost:
    entry = _check_keys(entry, HOST_KEYS, where)
    status = entry["status"]
    if status not in STATUSES:
        raise BadNight(f"{where}: status {status!r} is unknown (known: {', '.join(STATUSES)})")
    if not entry["place"]:
        raise BadNight(f"{where}: place must not be empty")
    for key in ("started", "ended"):
        _check_time(entry[key], f"{where}: {key}")
    if status in WITH_RUN_DIR:
        if entry["run_dir"] is not None:
            _check_run_dir(entry["run_dir"], where)
    elif entry["run_dir"] is not None or entry["verdict"] is not None:
        raise BadNight(f"{where}: a {status} host has no run folder: run_dir and verdict must be null")
    if status in ("held", "not_reserved") and entry["exit_code"] is not None:
        raise BadNight(f"{where}: a {status} host never ran certify: exit_code must be null")
    if status == "certified":
        if entry["run_dir"] is None:
            raise BadNight(f"{where}: a certified host must name its run_dir")
        if entry["verdict"] not in OVERALL_VERDICTS:
            raise BadNight(
                f"{where}: verdict {entry['verdict']!r} of a certified host is unknown "
                f"(known: {', '.join(OVERALL_VERDICTS)})"
            )
        if entry["exit_code"] != EXIT_CODES[entry["verdict"]]:
            raise BadNight(
                f"{where}: exit_code {entry['exit_code']} does not go with verdict {entry['verdict']!r} "
                f"({EXIT_CODES[entry['verdict']]})"
            )
    if status == "incomplete" and entry["verdict"] not in (None, *OVERALL_VERDICTS):
        raise BadNight(
            f"{where}: verdict {entry['verdict']!r} is unknown (known: {', '.join(OVERALL_VERDICTS)}, null)"
        )
    if status != "certified" and not entry["reason"]:
        raise BadNight(f"{where}: a {status} host needs a reason (what happened)")
    return NightHost(**entry)


def night_from_dict(data: Any, source: str) -> Night:
    """The Night a decoded lab-run.json holds; `source` names the file in every error."""
    data = _check_keys(data, NIGHT_KEYS, source)
    if data["schema_version"] != SCHEMA_VERSION:
        raise BadNight(
            f"{source}: schema_version {data['schema_version']} (this hilconform reads {SCHEMA_VERSION})"
        )
    if data["kind"] != KIND:
        raise BadNight(f"{source}: kind {data['kind']!r} is not {KIND!r}")
    for key in ("started", "ended"):
        _check_time(data[key], f"{source}: {key}")
    for tag, value in data["tags"].items():
        if not isinstance(value, str):
            raise BadNight(f"{source}: tags: {tag} must be a string")
    hosts = [_host(entry, f"{source}: hosts[{i}]") for i, entry in enumerate(data["hosts"])]
    places = [h.place for h in hosts]
    twice = sorted({p for p in places if places.count(p) > 1})
    if twice:
        raise BadNight(f"{source}: hosts: place {twice[0]!r} is listed more than once")
    return Night(
        coordinator=data["coordinator"],
        tags=dict(data["tags"]),
        started=data["started"],
        ended=data["ended"],
        hosts=hosts,
    )


def night_to_dict(night: Night) -> dict:
    """The JSON form of a night, keys in NIGHT_KEYS's order."""
    data = asdict(night)
    return {key: data[key] for key in NIGHT_KEYS}


def read_night(night_dir: Path) -> Night:
    """The night in `night_dir`; a missing folder or file, bad JSON or a schema error raises BadNight."""
    night_dir = Path(night_dir)
    if not night_dir.is_dir():
        raise BadNight(f"{night_dir}: not a folder (a NIGHT_DIR written by `hilconform lab run`)")
    path = night_dir / NIGHT_FILE
    if not path.is_file():
        raise BadNight(f"{night_dir}: no {NIGHT_FILE} (not a night written by `hilconform lab run`)")
    data = read_json(path, BadNight)
    return night_from_dict(data, str(path))


def write_night(night_dir: Path, night: Night) -> Path:
    """Write `night_dir`/lab-run.json atomically (a reader never sees half a file); it is checked
    with the reader's rules first, so a bad record fails where it is made, not the next morning."""
    data = night_to_dict(night)
    night_from_dict(json.loads(json.dumps(data)), f"lab-run.json for {night_dir}")
    night_dir = Path(night_dir)
    night_dir.mkdir(parents=True, exist_ok=True)
    path = night_dir / NIGHT_FILE
    tmp = path.with_name(f".{NIGHT_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


__all__ = [
    "NIGHT_FILE",
    "STATUSES",
    "BadNight",
    "Night",
    "NightHost",
    "night_from_dict",
    "night_to_dict",
    "read_night",
    "write_night",
]
