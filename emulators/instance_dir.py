"""Short per-instance folders for sockets, logs and disks.

Unix socket paths are limited to ~107 bytes, so every VM gets a folder under
a short root of the user's own (``/tmp/hilc-UID`` unless HILCONFORM_RUN_ROOT says
otherwise). The root is the user's alone: made 0700, and before each use checked to be a
real folder (not a link) owned by this user with no access for others, since a path
under /tmp is one another user can make first, and one a run of root's left behind
would refuse every other user (PermissionError). The
folder records its owner (``owner.pid``) and every child started for it
(``pids/*.pid``), each with its process identity (process_identity.py).
Folders whose owner is gone are stale (a crashed run) and are removed, after
killing the recorded children that are provably still ours, before a new one
is made. A PID whose identity does not match its record belongs to someone
else now: it is never signalled, and an owner record that does not match
counts as gone.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from .errors import InfrastructureError
from .process_identity import PidRecord, kill_if_same, read_pid_file, write_pid_file

OWNER_FILE = "owner.pid"
PIDS_DIR = "pids"


class RunRootUnsafe(InfrastructureError):
    """The run root is not this user's own folder (another user's, a link, open to others)."""


def default_run_root() -> Path:
    return Path(f"/tmp/hilc-{os.getuid()}")


def run_root() -> Path:
    """The user's own short root for instance folders, made or checked (see the module doc)."""
    root = Path(os.environ.get("HILCONFORM_RUN_ROOT") or default_run_root())
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    check_own_folder(root)
    return root


def check_own_folder(folder: Path) -> None:
    """Refuse a folder that is not this user's alone; tighten one of ours that others may enter."""
    info = os.lstat(folder)
    where = "set by HILCONFORM_RUN_ROOT" if os.environ.get("HILCONFORM_RUN_ROOT") else "the default"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        what = "a link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise RunRootUnsafe(f"the run root {folder} ({where}) is {what}: "
                            "hilconform keeps its sockets and disks only in a real folder of the user's own; "
                            "remove it or set HILCONFORM_RUN_ROOT to a folder of yours")
    if info.st_uid != os.getuid():
        raise RunRootUnsafe(f"the run root {folder} ({where}) belongs to uid {info.st_uid}, not to this user "
                            f"(uid {os.getuid()}): another user made it first; set HILCONFORM_RUN_ROOT to a "
                            "short folder of your own (Unix socket paths must stay under ~107 bytes)")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, 0o700)


def _owner_gone(owner: PidRecord) -> str | None:
    """Why the folder's owner is gone, or None while it may still be running."""
    if owner.identity is not None:
        try:
            return owner.identity.mismatch()
        except OSError:
            return None  # /proc cannot tell: not proved gone, so the folder stays
    # An old-format owner.pid (a bare PID) proves nothing either way: a live PID keeps the
    # folder, as before, since removing a running owner's sockets would break its run.
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return f"no process {owner.pid}"
    except PermissionError:
        pass
    return None


def _say(message: str) -> None:
    print(f"hilconform: {message}", file=sys.stderr)


def _end_recorded_children(folder: Path) -> None:
    """SIGKILL each child recorded in folder/pids that is provably ours; say what was spared."""
    for pid_file in sorted((folder / PIDS_DIR).glob("*.pid")):
        name = pid_file.stem
        try:
            record = read_pid_file(pid_file)
        except (OSError, ValueError) as exc:
            _say(f"{folder}: {name} not killed: unreadable pid file ({exc})")
            continue
        why = record.mismatch() if record.identity is None else kill_if_same(record.identity)
        if why is None:
            _say(f"{folder}: killed {name} (PID {record.pid}, left running by a dead owner)")
        else:
            _say(f"{folder}: {name} not killed: {why}")


def clean_stale(root: Path | None = None) -> list[Path]:
    """Remove folders left by runs whose owner died; return what was removed."""
    root = root or run_root()
    removed = []
    for folder in sorted(root.iterdir()):
        try:
            owner = read_pid_file(folder / OWNER_FILE)
        except (OSError, ValueError):
            continue  # no owner file: kept on purpose (keep=True), or not one of ours
        why_gone = _owner_gone(owner)
        if why_gone is None:
            continue
        _end_recorded_children(folder)
        shutil.rmtree(folder, ignore_errors=True)
        _say(f"removed stale instance folder {folder} (owner gone: {why_gone})")
        removed.append(folder)
    return removed


def make_instance_dir(label: str) -> Path:
    """A fresh folder like /tmp/hilc-0/a100-gw0-x1y2; short enough for sockets."""
    root = run_root()
    clean_stale(root)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    prefix = f"{label}-{worker}-" if worker else f"{label}-"
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    (folder / PIDS_DIR).mkdir()
    write_pid_file(folder / OWNER_FILE, os.getpid())
    return folder


def remove_instance_dir(folder: Path, keep: bool = False) -> None:
    if keep:
        (folder / OWNER_FILE).unlink(missing_ok=True)
        return
    shutil.rmtree(folder, ignore_errors=True)
