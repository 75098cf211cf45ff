"""A real labgrid lab on this machine for the lab tests: a coordinator on a free loopback port,
one exporter per stand-in host publishing its SSH port as a NetworkService, places made and
tagged with labgrid's own client (docs/toolchain-labgrid.md has the facts this rests on).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hilconform.fixtures.labgrid_lab import Lab

READY_S = 60.0
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


class LabBed:
    """The coordinator and exporters started by `start()`; `stop()` ends them (SIGTERM, then KILL)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.address: str | None = None
        self.coordinator: subprocess.Popen | None = None
        self.exporters: dict[str, subprocess.Popen] = {}

    def start(self) -> LabBed:
        state = self.folder / "coordinator"
        state.mkdir(parents=True, exist_ok=True)  # it keeps places.yaml in its working folder
        log = state / "coordinator.log"
        with log.open("w") as out:
            self.coordinator = subprocess.Popen([tool("labgrid-coordinator"), "-l", "127.0.0.1:0"], cwd=state,
                                                stdout=out, stderr=subprocess.STDOUT)
        found = self._wait_for(log, re.compile(r"listening on (127\.0\.0\.1:\d+)"), "the coordinator")
        self.address = found.group(1)
        return self

    def export(self, group: str, ssh_port: int) -> None:
        """One exporter (named after its group) with one NetworkService; waits until it is seen."""
        config = self.folder / f"exporter-{group}.yaml"
        config.write_text(f"{group}:\n  NetworkService:\n    address: 127.0.0.1\n    port: {ssh_port}\n"
                          "    username: root\n")
        log = self.folder / f"exporter-{group}.log"
        with log.open("w") as out:
            self.exporters[group] = subprocess.Popen(
                [tool("labgrid-exporter"), "-c", self.address, "-n", f"exp-{group}", "--hostname",
                 "127.0.0.1", str(config)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            with Lab(self.address) as lab:
                lab._sync()
                if group in lab._session.resources.get(f"exp-{group}", {}):
                    return
            assert self.exporters[group].poll() is None, f"exporter {group} ended: {log.read_text()}"
            time.sleep(0.5)
        raise AssertionError(f"exporter {group}'s NetworkService never appeared: {log.read_text()}")

    def stop_exporter(self, group: str) -> None:
        _end(self.exporters.pop(group))

    def client(self, *args: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        if user:
            env["LG_USERNAME"] = user
        done = subprocess.run([tool("labgrid-client"), "-x", self.address, *args], capture_output=True,
                              text=True, env=env, timeout=120)
        assert not check or done.returncode == 0, f"labgrid-client {' '.join(args)}: {done.stderr}"
        return done

    def make_place(self, name: str, group: str, **tags: str) -> None:
        self.client("-p", name, "create")
        self.client("-p", name, "add-match", f"exp-{group}/{group}/NetworkService")
        self.client("-p", name, "set-tags", *(f"{k}={v}" for k, v in tags.items()))

    def holder(self, place: str) -> str | None:
        with Lab(self.address) as lab:
            return lab.place(place).holder

    def stop(self) -> None:
        for group in list(self.exporters):
            self.stop_exporter(group)
        if self.coordinator is not None:
            _end(self.coordinator)

    def _wait_for(self, log: Path, pattern: re.Pattern, what: str) -> re.Match:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            found = pattern.search(log.read_text())
            if found:
                return found
            assert self.coordinator.poll() is None, f"{what} ended: {log.read_text()}"
            time.sleep(0.2)
        raise AssertionError(f"{what} did not say it was ready within {READY_S:.0f} s: {log.read_text()}")


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
