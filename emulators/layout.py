"""Names of the files and sockets inside one VM's instance folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class InstanceLayout:
    folder: Path

    @property
    def qmp_socket(self) -> Path:
        return self.folder / "qmp.sock"

    @property
    def agent_socket(self) -> Path:
        return self.folder / "qga.sock"

    @property
    def runtime_socket(self) -> Path:
        return self.folder / "rt.sock"

    @property
    def console_log(self) -> Path:
        return self.folder / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.folder / "qemu.log"

    @property
    def qmp_events(self) -> Path:
        return self.folder / "qmp-events.jsonl"

    @property
    def guest_share(self) -> Path:
        """Shared read-only into the guest as `hilconform_run` (runtime config)."""
        return self.folder / "share"

    @property
    def pids(self) -> Path:
        return self.folder / "pids"

    def nbd_socket(self, slot: str) -> Path:
        return self.folder / f"nbd-{slot}.sock"

    def nbd_image(self, slot: str) -> Path:
        return self.folder / f"disk-{slot}.raw"

    def nbd_log(self, slot: str) -> Path:
        return self.folder / f"nbd-{slot}.log"
