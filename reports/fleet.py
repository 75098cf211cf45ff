"""fleet.json and fleet.html: a lab's hosts across clauses and nights, from `hilconform lab run` nights.

A certificate answers for one host and one run; a lab asks other questions every morning: which
host fails which clause tonight, what changed since last night, and whether a figure is drifting.
The fleet report answers them from files alone: each NIGHT_DIR's lab-run.json (reports/lab_night.py)
and the certificate.json of each run folder it names; it never asks a coordinator or a host.

* the newest night's hosts × clauses matrix: each clause's verdict and its key figure (below);
  a host without a certificate shows its status and reason instead;
* per host of the newest night: host, device models and links (from the certificate), run folder,
  verdict, exit code;
* the nights side by side, newest first: each host's overall verdict, and every clause verdict that
  changed since the host's previous certified night (reports/diff.py's diff_certificates);
* per clause, its key figure over the nights, one series per host.

The **key figure** of a clause is the median of the clause's figure whose key sorts first (the
order the certificate lists them in: by figure name); a clause without figures has none. A trend
follows one figure by its key: the one that is the key figure in the host's newest certificate
having that clause, looked up by the same key in every other night (absent: a gap).

fleet.json is validated against fleet.schema.json before it is written and when it is read back
(`read_fleet`); fleet.html (reports/fleet_html.py) is drawn from the fleet.json content alone.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hilconform.fixtures.errors import BadInput

from . import fleet_html
from .certificate import SCHEMA_VERSION as CERTIFICATE_SCHEMA_VERSION
from .certificate import CertificateInvalid, clause_order, validate
from .diff import diff_certificates
from .json_file import check_schema, read_json
from .lab_night import BadNight, Night, NightHost, read_night

SCHEMA_VERSION = 1
KIND = "hilconform-fleet"
FLEET_JSON = "fleet.json"
FLEET_HTML = "fleet.html"
SCHEMA_FILE = Path(__file__).with_name("fleet.schema.json")
KEY_FIGURE_STAT = "median"


class BadFleet(BadInput):
    """A fleet.json that does not match its schema (edited by hand, or written by another version)."""


@dataclass
class LoadedNight:
    """A night's record and the certificates of its hosts that have one (by place); `problems` says
    why a host that should have one has none, or why its certificate disagrees with lab-run.json."""

    path: Path
    night: Night
    certificates: dict[str, dict] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


def _read_certificate(night_dir: Path, host: NightHost) -> tuple[dict | None, str | None]:
    """The host's certificate, read and checked against its schema, or None and why not."""
    if host.run_dir is None:
        return None, None
    where = f"{host.run_dir}/certificate.json"
    path = night_dir / host.run_dir / "certificate.json"
    if not path.is_file():
        return None, f"{where} is missing"
    try:
        certificate = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{where} is unreadable ({exc})"
    version = certificate.get("schema_version") if isinstance(certificate, dict) else None
    if version != CERTIFICATE_SCHEMA_VERSION:
        return (
            None,
            f"{where} has schema version {version!r}, this hilconform reads {CERTIFICATE_SCHEMA_VERSION}",
        )
    try:
        validate(certificate)
    except CertificateInvalid as exc:
        return None, f"{where}: {exc}"
    if host.verdict is not None and host.verdict != certificate["verdict"]:
        return certificate, f"lab-run.json says {host.verdict}, {where} says {certificate['verdict']}"
    return certificate, None


def load_nights(night_dir: Path, previous: list[Path]) -> list[LoadedNight]:
    """Every night given, oldest first (by `started`); BadNight for a folder given twice or a bad one."""
    seen: dict[Path, Path] = {}
    nights = []
    for path in [Path(night_dir), *map(Path, previous)]:
        night = read_night(path)  # first: a missing folder is named as given
        real = path.resolve()
        if real in seen:
            raise BadNight(f"{path}: the same night is given twice (also as {seen[real]})")
        seen[real] = path
        loaded = LoadedNight(path, night)
        for host in night.hosts:
            certificate, problem = _read_certificate(path, host)
            if certificate is not None:
                loaded.certificates[host.place] = certificate
            if problem:
                loaded.problems[host.place] = problem
        nights.append(loaded)
    return sorted(nights, key=lambda n: (n.night.started_at, str(n.path)))


def key_figure(clause: dict) -> dict | None:
    """The clause's key figure (see the module's docstring), or None when it has no figure."""
    figures = sorted(clause["figures"], key=lambda f: f["key"])
    if not figures:
        return None
    first = figures[0]
    return {
        "key": first["key"],
        "stat": KEY_FIGURE_STAT,
        "value": first[KEY_FIGURE_STAT],
        "unit": first["unit"],
    }


def _link_text(link: dict) -> str | None:
    """`16 GT/s x16 (cap 16 GT/s x16)` from a device's link record; None without one."""
    if not link:
        return None

    def part(speed, width) -> str:
        speed_text = "?" if speed is None else f"{speed:g}"
        return f"{speed_text} GT/s x{'?' if width is None else width}"

    text = part(link.get("speed_gts"), link.get("width"))
    if "cap_speed_gts" in link or "cap_width" in link:
        text += f" (cap {part(link.get('cap_speed_gts'), link.get('cap_width'))})"
    return text


def device_models(certificate: dict) -> list[dict]:
    """The certificate's devices grouped by model (vendor:device, subsystem, class): where they sat,
    the links and firmware seen, and the device-plugin resource serving those IDs, if any."""
    resources = {
        ids: resource["name"]
        for resource in (certificate.get("device_plugin") or {}).get("resources", [])
        for ids in resource["device_ids"]
    }
    models: dict[tuple, dict] = {}
    for device in certificate["devices"]:
        ids = f"{device['vendor_id'] or '?'}:{device['device_id'] or '?'}"
        subsystem = f"{device['subsystem_vendor_id'] or '?'}:{device['subsystem_id'] or '?'}"
        model = models.setdefault(
            (ids, subsystem, device["class_code"]),
            {
                "ids": ids,
                "subsystem": subsystem,
                "class_code": device["class_code"],
                "resource": resources.get(ids),
                "bdfs": set(),
                "links": set(),
                "firmware": set(),
            },
        )
        model["bdfs"].add(device["bdf"])
        if _link_text(device["link"]):
            model["links"].add(_link_text(device["link"]))
        if device["firmware"]:
            model["firmware"].add(device["firmware"])
    return [
        {**m, "bdfs": sorted(m["bdfs"]), "links": sorted(m["links"]), "firmware": sorted(m["firmware"])}
        for _key, m in sorted(models.items())
    ]


def _relative(path: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(path.resolve(), out_dir.resolve())).as_posix()


def _report_link(loaded: LoadedNight, host: NightHost, out_dir: Path) -> str | None:
    """The run folder's report.html relative to the fleet report's folder; None when there is none."""
    if host.run_dir is None:
        return None
    page = loaded.path / host.run_dir / "report.html"
    return _relative(page, out_dir) if page.is_file() else None


def _verdict(host: NightHost, certificate: dict | None) -> str | None:
    """The overall verdict lab-run.json recorded, else the certificate's (an incomplete host's)."""
    return host.verdict or (certificate["verdict"] if certificate else None)


def _matrix_host(loaded: LoadedNight, host: NightHost, out_dir: Path) -> dict:
    certificate = loaded.certificates.get(host.place)
    cells = {}
    if certificate is not None:
        cells = {c["id"]: {"verdict": c["verdict"], "figure": key_figure(c)} for c in certificate["clauses"]}
    return {
        "place": host.place,
        "status": host.status,
        "reason": host.reason,
        "verdict": _verdict(host, certificate),
        "exit_code": host.exit_code,
        "run_dir": host.run_dir,
        "report": _report_link(loaded, host, out_dir),
        "problem": loaded.problems.get(host.place),
        "host": {key: certificate["host"][key] for key in ("spec", "profile", "description")}
        if certificate
        else None,
        "devices": device_models(certificate) if certificate else [],
        "cells": cells,
    }


def _night_entry(nights: list[LoadedNight], index: int, out_dir: Path) -> dict:
    """Night `index` (oldest first) with, per host, what changed since its last certified night."""
    loaded = nights[index]
    hosts = []
    for host in loaded.night.hosts:
        certificate = loaded.certificates.get(host.place)
        before = None
        if certificate is not None:
            before = next((n for n in reversed(nights[:index]) if host.place in n.certificates), None)
        changes = []
        if before is not None:
            diff = diff_certificates(before.certificates[host.place], certificate)
            changes = [{"clause": c, "before": a, "after": b} for c, a, b in diff.clauses]
            clauses_before = {c["id"]: c["verdict"] for c in before.certificates[host.place]["clauses"]}
            clauses_now = {c["id"]: c["verdict"] for c in certificate["clauses"]}
            changes += [{"clause": c, "before": clauses_before[c], "after": None} for c in diff.only_in_a]
            changes += [{"clause": c, "before": None, "after": clauses_now[c]} for c in diff.only_in_b]
            changes.sort(key=lambda change: clause_order(change["clause"]))
        hosts.append(
            {
                "place": host.place,
                "status": host.status,
                "reason": host.reason,
                "verdict": _verdict(host, certificate),
                "exit_code": host.exit_code,
                "report": _report_link(loaded, host, out_dir),
                "compared_with": before.night.started if before else None,
                "verdict_before": before.certificates[host.place]["verdict"] if before else None,
                "changes": changes,
            }
        )
    return {
        "started": loaded.night.started,
        "ended": loaded.night.ended,
        "coordinator": loaded.night.coordinator,
        "tags": loaded.night.tags,
        "night_dir": _relative(loaded.path, out_dir),
        "hosts": hosts,
    }


def _places(nights: list[LoadedNight]) -> list[str]:
    """Every place of any night: the newest night's in its order, then the others by name."""
    newest = [h.place for h in nights[-1].night.hosts]
    others = {h.place for n in nights for h in n.night.hosts} - set(newest)
    return newest + sorted(others)


def _figure_value(clause: dict | None, key: str) -> float | None:
    """The key-figure statistic of the clause's figure `key`; None when the clause or figure is missing."""
    figure = next((f for f in (clause or {}).get("figures", []) if f["key"] == key), None)
    return figure[KEY_FIGURE_STAT] if figure else None


def _trends(nights: list[LoadedNight]) -> list[dict]:
    """Per clause of any certificate, one series per host: its key figure's median in each night."""
    statements: dict[str, str] = {}
    for loaded in nights:
        for certificate in loaded.certificates.values():
            for clause in certificate["clauses"]:
                statements.setdefault(clause["id"], clause["statement"])
    trends = []
    for clause_id in sorted(statements, key=clause_order):
        series = []
        for place in _places(nights):
            per_night = [
                {c["id"]: c for c in n.certificates[place]["clauses"]}.get(clause_id)
                if place in n.certificates
                else None
                for n in nights
            ]
            reference = next(filter(None, (key_figure(c) for c in reversed(per_night) if c)), None)
            if reference is None:
                continue
            points = [
                {"night": loaded.night.started, "value": _figure_value(clause, reference["key"])}
                for loaded, clause in zip(nights, per_night, strict=True)
            ]
            series.append(
                {"place": place, "key": reference["key"], "unit": reference["unit"], "points": points}
            )
        if series:
            trends.append({"clause": clause_id, "statement": statements[clause_id], "series": series})
    return trends


def build_fleet(night_dir: Path, previous: list[Path], out_dir: Path | None = None) -> dict:
    """The fleet.json content for the night in `night_dir` and the `previous` ones (any order).

    The matrix and host details are the newest night's (by `started`); links are relative to
    `out_dir` (default: `night_dir`, where the report is written). Raises BadNight.
    """
    out_dir = Path(out_dir or night_dir)
    nights = load_nights(Path(night_dir), list(previous))
    newest = nights[-1]
    clause_ids = {c["id"]: c["statement"] for cert in newest.certificates.values() for c in cert["clauses"]}
    fleet = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "newest_night": newest.night.started,
        "clauses": [{"id": c, "statement": clause_ids[c]} for c in sorted(clause_ids, key=clause_order)],
        "hosts": [_matrix_host(newest, host, out_dir) for host in newest.night.hosts],
        "nights": [_night_entry(nights, i, out_dir) for i in reversed(range(len(nights)))],
        "trends": _trends(nights),
    }
    check_fleet(fleet, "fleet.json (as built)")
    return fleet


@functools.cache
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def check_fleet(fleet: dict, where: str) -> None:
    """BadFleet naming `where` and the key when `fleet` does not match fleet.schema.json."""
    check_schema(fleet, schema(), where, BadFleet)


def read_fleet(path: Path) -> dict:
    """A fleet.json read back and checked strictly against its schema (an unknown key is an error)."""
    path = Path(path)
    fleet = read_json(path, BadFleet)
    check_fleet(fleet, str(path))
    return fleet


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_fleet_report(
    night_dir: Path, previous: list[Path], out_dir: Path | None = None
) -> tuple[Path, Path]:
    """Write fleet.json and fleet.html into `out_dir` (default `night_dir`); returns their paths."""
    out_dir = Path(out_dir or night_dir)
    fleet = build_fleet(night_dir, previous, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / FLEET_JSON, out_dir / FLEET_HTML
    _write(json_path, json.dumps(fleet, indent=1) + "\n")
    _write(html_path, fleet_html.render(fleet))
    return json_path, html_path


__all__ = [
    "FLEET_HTML",
    "FLEET_JSON",
    "BadFleet",
    "build_fleet",
    "key_figure",
    "read_fleet",
    "write_fleet_report",
]
