"""Files allure-pytest does not write: environment.properties and categories.json.

Categories separate infrastructure errors (the test bed broke: an *error* with
hilconform's broken marker) from conformance failures (a clause failed), so a
lab browsing Allure never mistakes one for the other. Allure matches
categories in order; the first that matches a result wins.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CATEGORIES = [
    {
        "name": "Infrastructure errors (test bed broken: no verdict)",
        "description": "QEMU died, no guest image, QMP or the guest agent silent: the clause was not judged.",
        "matchedStatuses": ["broken"],
        "traceRegex": "(?s).*(InfrastructureError|QemuDied|ImageMissing|ToolMissing|QmpError|GuestAgentError|"
        "WaitTimeout|FaultError|ProfileError).*",
    },
    {"name": "Test errors (the suite's own code crashed: no verdict)", "matchedStatuses": ["broken"]},
    {"name": "Conformance failures (a clause failed)", "matchedStatuses": ["failed"]},
    {"name": "Not checked (host lacks a capability)", "matchedStatuses": ["skipped"]},
]


def write_categories(results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "categories.json").write_text(json.dumps(CATEGORIES, indent=1))


def write_environment(results: Path, certificate: dict) -> None:
    """Allure's Environment widget: host, profile, versions, run id, verdict, the device plugin."""
    values = {
        "run": certificate["run"]["id"],
        "host": certificate["host"]["spec"],
        "profile": certificate["host"]["profile"],
        "hotplug_mode": certificate["host"]["hotplug_mode"],
        "verdict": certificate["verdict"],
    }
    values.update({f"version.{k}": v for k, v in certificate["versions"].items()})
    plugin = certificate.get("device_plugin")
    if plugin:
        values["device_plugin"] = plugin["command"] or plugin["kind"]
        values["device_plugin.sha256"] = plugin["sha256"]
    lines = [f"{key}={_escape(str(value))}" for key, value in values.items() if value is not None]
    results.mkdir(parents=True, exist_ok=True)
    (results / "environment.properties").write_text("\n".join(lines) + "\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


def renderer() -> str | None:
    """The Allure command-line renderer, when installed (never required)."""
    return shutil.which("allure")


def render_command(results: Path) -> list[str] | None:
    tool = renderer()
    if tool is None:
        return None
    return [tool, "generate", str(results), "-o", str(results.parent / "allure-report"), "--clean"]
