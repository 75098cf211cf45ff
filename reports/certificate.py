"""certificate.json: what a run found, per clause, with its figures, host, devices, versions and
the device plugin it certified.

Built only from the run folder's files; validated against
`certificate.schema.json` (shipped beside this module, documented in
docs/certificate.md) before it is written. `schema_version` changes when a
field changes meaning or goes away; `report diff` refuses to compare across it.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import subprocess
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from hilconform.fixtures.errors import BadInput

from .json_file import check_schema
from .run_folder import RunFolder
from .verdicts import UNFINISHED_OUTCOMES, clause_verdict, overall_verdict

SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("certificate.schema.json")
SPEC = Path(__file__).resolve().parent.parent / "docs" / "spec.md"
_SPEC_ROW = re.compile(r"^\|\s*([A-Z]+-\d{2})\s*\|\s*([^|]+?)\s*\|")


class CertificateInvalid(BadInput):
    """A certificate does not match its schema (a bug in the builder, or a file edited by hand)."""


@functools.cache
def clause_statements(spec: Path = SPEC) -> dict[str, str]:
    """Clause ID → its short statement, from the spec table (empty when the spec is not at hand)."""
    if not spec.is_file():
        return {}
    rows = (_SPEC_ROW.match(line) for line in spec.read_text().splitlines())
    return {m.group(1): m.group(2) for m in rows if m}


@functools.cache
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def validate(certificate: dict) -> None:
    check_schema(certificate, schema(), "certificate.json", CertificateInvalid)


def figure_key(figure: dict) -> str:
    """`CLAUSE name` plus the test's parameters, e.g. `DISC-02 hot_add_latency [acpi]`."""
    params = re.search(r"(\[[^\]]*\])$", figure.get("nodeid", ""))
    return f"{figure['clause']} {figure['name']}" + (f" {params.group(1)}" if params else "")


def tool_versions() -> dict:
    """The tool's versions, taken when the run starts (run.json), so a later rebuild keeps them."""

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "hilconform": version("hilconform"),
        "python": platform.python_version(),
        "pytest": version("pytest"),
        "pytest_xdist": version("pytest-xdist"),
        "allure_pytest": version("allure-pytest"),
        "hilconform_checkout": _checkout_commit(),
    }


def _checkout_commit() -> str | None:
    """`git describe --always --dirty` of the source checkout, or None outside one (an installed
    hilconform inside someone else's repository must not take that repository's commit)."""
    checkout = Path(__file__).resolve().parent.parent
    if not (checkout / "pyproject.toml").is_file():  # site-packages/hilconform: no checkout
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _firmware_versions(events: dict[str, list[dict]]) -> dict[tuple[str, str], str]:
    found = {}
    for instance, log in events.items():
        for event in log:
            data = event.get("data", {})
            if event.get("event") == "procedure" and data.get("step") == "firmware" and data.get("version"):
                found[(instance, data["device"])] = data["version"]
    return found


def _devices(hosts: list[dict], firmware: dict) -> list[dict]:
    devices = []
    for host in hosts:
        inventory = host.get("inventory") or {}
        for record in inventory.get("devices", []):
            info = record.get("info", {})
            devices.append(
                {
                    "host_instance": host["instance"],
                    "bdf": record["device"],
                    "vendor_id": info.get("vendor_id"),
                    "device_id": info.get("device_id"),
                    "subsystem_vendor_id": info.get("subsystem_vendor_id"),
                    "subsystem_id": info.get("subsystem_id"),
                    "class_code": info.get("class_code"),
                    "driver": info.get("driver"),
                    "firmware": firmware.get((host["instance"], record["device"])),
                    "link": info.get("link") or {},
                    "slot": record.get("slot"),
                    "fingerprint": record.get("fingerprint"),
                    "state": record.get("state"),
                }
            )
    return devices


def _figures(measurements: list[dict]) -> dict[str, list[dict]]:
    per_clause = defaultdict(list)
    for m in measurements:
        per_clause[m["clause"]].append(
            {
                "key": figure_key(m),
                "name": m["name"],
                "nodeid": m.get("nodeid", ""),
                "unit": m["unit"],
                "n": m["n"],
                "min": m["min"],
                "median": m["median"],
                "p95": m["p95"],
                "max": m["max"],
                "budget": m.get("budget"),
                "budget_stat": m.get("budget_stat"),
                "within_budget": m.get("within_budget"),
                "values": m.get("values", []),
            }
        )
    return per_clause


PRECONDITION_KEYS = ("nodeid", "name", "precondition", "release_on", "released_by", "held_ms", "met", "note")


def _preconditions(records: list[dict]) -> dict[str, list[dict]]:
    """Per clause, what its tests held in place and whether it was in place when the runtime acted."""
    per_clause = defaultdict(list)
    for record in records:
        per_clause[record["clause"]].append({key: record.get(key) for key in PRECONDITION_KEYS})
    return per_clause


def _device_plugin(records: list[dict]) -> dict | None:
    """The plugin the DP tests certified, from every worker's record (the same plugin: resources and
    Register API versions joined); None when no DP test ran."""
    if not records:
        return None
    served: dict[str, set[str]] = defaultdict(set)
    api_versions: set[str] = set()
    for record in records:
        for resource in record.get("resources", []):
            served[resource["name"]].update(resource.get("device_ids", []))
        api_versions.update(record.get("api_versions", []))
    first = records[0]
    return {
        "kind": first.get("kind"),
        "command": first.get("command"),
        "path": first.get("path"),
        "sha256": first.get("sha256"),
        "image": first.get("image"),
        "resources": [{"name": name, "device_ids": sorted(ids)} for name, ids in sorted(served.items())],
        "api_versions": sorted(api_versions),
        "claims": first.get("claims", []),
    }


def _every_test(run: RunFolder, scope: dict) -> list[dict]:
    """One record per test: what progress.jsonl says, and an `unfinished` one for every test of the
    run's scope (or started in it) that left no record, so a test that did not report can never leave
    its clause looking passed. A record's clause falls back on the scope's (a crash report has none)."""
    clause_of = {nodeid: clause for clause, nodeids in scope.get("clauses", {}).items() for nodeid in nodeids}
    progress = run.progress_records()
    records = [r for r in progress if r.get("kind") == "test"]
    started = [r["nodeid"] for r in progress if r.get("kind") == "start"]
    for record in records:
        record["clause"] = record.get("clause") or clause_of.get(record["nodeid"])
    reported = {r["nodeid"] for r in records}
    for nodeid in dict.fromkeys([*scope.get("tests", []), *started]):
        if nodeid in reported:
            continue
        why = "started, never reported an end" if nodeid in started else "never started"
        records.append(
            {
                "kind": "test",
                "nodeid": nodeid,
                "clause": clause_of.get(nodeid),
                "outcome": "unfinished",
                "message": f"did not finish: {why}",
                "duration_s": 0.0,
            }
        )
    return records


def build(run: RunFolder, sensitivity: dict | None = None) -> dict:
    """The certificate of a run folder, complete or not (a run cut short is `incomplete`)."""
    meta = run.read_run()
    scope = meta.get("scope", {})
    scope_clauses: dict[str, list[str]] = scope.get("clauses", {})
    tests = _every_test(run, scope)
    by_clause: dict[str, list[dict]] = {c: [] for c in scope_clauses}
    others = {}
    for test in tests:
        if test.get("clause"):
            own = ({**test, "outcome": "passed"} if test.get("own_clause_passed")
                   and test["outcome"] == "failed" else test)  # failed for an also_failed clause alone
            by_clause.setdefault(test["clause"], []).append(own)
        else:
            others[test["nodeid"]] = test["outcome"]
        for clause in test.get("also_failed", []):  # e.g. LIFE-01, checked on every test's events
            if clause != test.get("clause"):
                by_clause.setdefault(clause, []).append(test)
    figures = _figures(run.measurements())
    held = _preconditions(run.preconditions())
    statements = clause_statements()
    clauses = []
    for clause_id in sorted(by_clause, key=clause_order):
        results = by_clause[clause_id]
        clauses.append(
            {
                "id": clause_id,
                "statement": statements.get(clause_id, ""),
                "verdict": clause_verdict([t["outcome"] for t in results]),
                "tests": [
                    {
                        "nodeid": t["nodeid"],
                        "outcome": t["outcome"],
                        "duration_s": round(t["duration_s"], 3),
                        "message": t.get("message", ""),
                    }
                    for t in results
                ],
                "figures": figures.get(clause_id, []),
                "preconditions": held.get(clause_id, []),
            }
        )
    finish = run.session_finish()
    pytest_exit = meta.get("pytest_exit")
    if pytest_exit is None and finish is not None:
        pytest_exit = finish["exitstatus"]
    unfinished = [t["nodeid"] for t in tests if t["outcome"] in UNFINISHED_OUTCOMES]
    overall = overall_verdict(
        {c["id"]: c["verdict"] for c in clauses}, others, meta.get("interrupted"), pytest_exit, unfinished
    )
    hosts = run.hosts()
    events = run.runtime_events()
    first = hosts[0] if hosts else {}
    runtime = first.get("runtime") or {}
    counts = defaultdict(int)
    for test in tests:
        counts[test["outcome"]] += 1
    certificate = {
        "schema_version": SCHEMA_VERSION,
        "kind": "hilconform-certificate",
        "status": "complete" if overall.verdict != "incomplete" else "incomplete",
        "verdict": overall.verdict,
        "exit_code": overall.exit_code,
        "reasons": overall.reasons,
        "run": {
            "id": meta["run_id"],
            "started": meta.get("started"),
            "finished": meta.get("finished"),
            "duration_s": meta.get("duration_s"),
            "suites": meta.get("suites", []),
            "clauses_selected": meta.get("clauses_selected", []),
            "workers": meta.get("workers"),
            "interrupted": meta.get("interrupted"),
            "pytest_exit": pytest_exit,
            "pytest_argv": meta.get("pytest_argv", []),
            "unfinished_tests": unfinished,
            "tests": dict(counts),
        },
        "host": {
            "spec": meta.get("host"),
            "profile": first.get("profile"),
            "description": first.get("description"),
            "hotplug_mode": first.get("hotplug_mode"),
            "accel": first.get("accel"),
            "instances": [h["instance"] for h in hosts],
            "budgets": first.get("budgets", {}),
        },
        "versions": {
            **(meta.get("tool_versions") or tool_versions()),
            "qemu": first.get("qemu_version"),
            "guest_kernel": first.get("guest_kernel"),
            "runtime": runtime.get("runtime"),
            "runtime_version": runtime.get("runtime_version"),
            "protocol": runtime.get("protocol"),
            "runtime_module": meta.get("runtime_module"),
        },
        "device_plugin": _device_plugin(run.device_plugins()),
        "devices": _devices(hosts, _firmware_versions(events)),
        "clauses": clauses,
        "other_tests": [
            {"nodeid": t["nodeid"], "outcome": t["outcome"], "message": t.get("message", "")}
            for t in tests
            if not t.get("clause")
        ],
        "sensitivity": sensitivity,
    }
    validate(certificate)
    return certificate


def clause_order(clause_id: str) -> tuple:
    """Sort key of a clause ID in spec order (areas as docs/spec.md lists them, then the number)."""
    areas = ["DISC", "LIFE", "HP", "AER", "RST", "DP", "REAL"]  # docs/spec.md order
    area, _, number = clause_id.partition("-")
    return (areas.index(area) if area in areas else len(areas), area, number)


def write(run: RunFolder, certificate: dict) -> Path:
    tmp = run.certificate.with_suffix(".tmp")
    tmp.write_text(json.dumps(certificate, indent=1))
    tmp.replace(run.certificate)
    return run.certificate
