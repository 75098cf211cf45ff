"""Short per-instance folders for sockets, logs and disks.

Unix socket paths are limited to ~107 bytes, so every VM gets a folder under
a short root (``/tmp/hilc`` unless HILCONFORM_RUN_ROOT says otherwise). The
folder records its owner's PID; folders whose owner is gone are stale (a
crashed run) and are removed, after killing any child they recorded, before a
new one is made.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

OWNER_FILE = "owner.pid"
PIDS_DIR = "pids"


def run_root() -> Path:
    root = Path(os.environ.get("HILCONFORM_RUN_ROOT", "/tmp/hilc"))
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    return root


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(root: Path | None = None) -> list[Path]:
    """Remove folders left by runs whose owner died; return what was removed."""
    root = root or run_root()
    removed = []
    for folder in root.iterdir():
        owner = folder / OWNER_FILE
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(pid):
            continue
        for pid_file in (folder / PIDS_DIR).glob("*.pid"):
            try:
                child = int(pid_file.read_text())
                os.kill(child, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        shutil.rmtree(folder, ignore_errors=True)
        print(f"hilconform: removed stale instance folder {folder} (owner {pid} gone)",
              file=sys.stderr)
        removed.append(folder)
    return removed


def make_instance_dir(label: str) -> Path:
    """A fresh folder like /tmp/hilc/a100-gw0-x1y2; short enough for sockets."""
    root = run_root()
    clean_stale(root)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    prefix = f"{label}-{worker}-" if worker else f"{label}-"
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    (folder / PIDS_DIR).mkdir()
    (folder / OWNER_FILE).write_text(f"{os.getpid()}\n")
    return folder


def remove_instance_dir(folder: Path, keep: bool = False) -> None:
    if keep:
        (folder / OWNER_FILE).unlink(missing_ok=True)
        return
    shutil.rmtree(folder, ignore_errors=True)
