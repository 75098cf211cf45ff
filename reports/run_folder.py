"""A run folder, `reports/<run-id>/`: the files a certification run leaves, and reading them back.

`run.json` marks a folder as a run folder (written first, completed last);
everything else is written by pytest's side (fixtures/run_record.py, the
measurements fixture, JUnit, allure-pytest) or derived from it (certificate,
HTML). The layout is documented in docs/reports.md.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from hilconform.fixtures.errors import BadInput

RUN_MARKER = "run.json"


class NotARunFolder(BadInput):
    """The path is not a folder written by `hilconform certify`."""


def _read_jsonl(path: Path) -> list[dict]:
    """Lines of a JSON-lines file; a torn last line (a run cut short mid-write) is dropped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _read_json_files(folder: Path) -> list[dict]:
    """Every `*.json` in `folder`, by name; an unreadable one (cut short mid-write) is skipped."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return out


@dataclass(frozen=True)
class RunFolder:
    path: Path

    # -- creating -------------------------------------------------------------------------------
    @classmethod
    def create(cls, base: Path, host: str) -> RunFolder:
        """A new, empty run folder under `base`, named after the UTC time and the host."""
        slug = re.sub(r"[^A-Za-z0-9]+", "-", host).strip("-")
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        for n in range(100):
            path = base / (f"{stamp}-{slug}" + (f"-{n}" if n else ""))
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                continue
            return cls(path)
        raise FileExistsError(f"no free run folder name under {base}")

    @classmethod
    def open(cls, path: Path | str) -> RunFolder:
        path = Path(path)
        if not path.is_dir():
            raise NotARunFolder(f"{path}: not a folder")
        if not (path / RUN_MARKER).is_file():
            raise NotARunFolder(
                f"{path}: not a run folder (no {RUN_MARKER}; run folders are made by `hilconform certify`)"
            )
        try:
            json.loads((path / RUN_MARKER).read_text())
        except json.JSONDecodeError as exc:
            raise NotARunFolder(f"{path / RUN_MARKER}: unreadable ({exc})") from None
        return cls(path)

    # -- paths ----------------------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.path / RUN_MARKER

    @property
    def progress(self) -> Path:
        return self.path / "progress.jsonl"

    @property
    def junit(self) -> Path:
        return self.path / "junit.xml"

    @property
    def allure_results(self) -> Path:
        return self.path / "allure-results"

    @property
    def measurements_dir(self) -> Path:
        return self.path / "measurements"

    @property
    def certificate(self) -> Path:
        return self.path / "certificate.json"

    @property
    def html(self) -> Path:
        return self.path / "report.html"

    @property
    def pytest_log(self) -> Path:
        return self.path / "pytest.log"

    @property
    def device_plugin_dir(self) -> Path:
        return self.path / "device-plugin"

    @property
    def sensitivity_dir(self) -> Path:
        return self.path / "sensitivity"

    # -- reading --------------------------------------------------------------------------------
    def read_run(self) -> dict:
        return json.loads(self.run_json.read_text())

    def write_run(self, meta: dict) -> None:
        tmp = self.run_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(self.run_json)

    def progress_records(self) -> list[dict]:
        return _read_jsonl(self.progress)

    def test_records(self) -> list[dict]:
        return [r for r in self.progress_records() if r.get("kind") == "test"]

    def session_finish(self) -> dict | None:
        ends = [r for r in self.progress_records() if r.get("kind") == "session_finish"]
        return ends[-1] if ends else None

    def measurements(self) -> list[dict]:
        return _read_json_files(self.measurements_dir)

    def preconditions(self) -> list[dict]:
        """Every precondition a test held and judged (fixtures/preconditions.py)."""
        return _read_json_files(self.measurements_dir / "preconditions")

    def hosts(self) -> list[dict]:
        return _read_json_files(self.path / "hosts")

    def device_plugins(self) -> list[dict]:
        """The device plugin each worker's DP tests certified (none when no DP test ran)."""
        return _read_json_files(self.device_plugin_dir)

    def runtime_events(self) -> dict[str, list[dict]]:
        """Runtime events per host instance, in receipt order."""
        return {path.stem: _read_jsonl(path) for path in sorted((self.path / "events").glob("*.jsonl"))}

    def read_certificate(self) -> dict:
        if not self.certificate.is_file():
            raise NotARunFolder(f"{self.path}: no certificate.json (the run did not finish writing it)")
        try:
            return json.loads(self.certificate.read_text())
        except json.JSONDecodeError as exc:
            raise NotARunFolder(f"{self.certificate}: unreadable ({exc})") from None
