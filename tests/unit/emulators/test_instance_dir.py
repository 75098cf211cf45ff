"""clean_stale kills only processes it can prove are ours, with real processes standing in.

A stale folder's pid files may name PIDs that were reused (after a reboot, on wrap-around): the
process there now is a stranger and must survive. Its owner.pid has the mirror problem: a
reused owner PID must not keep the folder forever.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
from pathlib import Path

import pytest

from hilconform.emulators import instance_dir
from hilconform.emulators.process_identity import ProcessIdentity, read_pid_file, write_pid_file
from hilconform.emulators.processes import ChildProcess


@pytest.fixture
def start_sleeper():
    """Start `sleep 60` processes; every one is ended (and reaped) at teardown."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "60"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _ended_by(proc: subprocess.Popen) -> int:
    """SIGTERM the process and return the signal that ended it.

    SIGKILL if clean_stale had already killed it (a pending SIGKILL wins), SIGTERM if it was
    still alive: decided without timing assumptions.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return -proc.wait(timeout=10)


def _dead_identity(start_sleeper) -> ProcessIdentity:
    """The recorded identity of a process that has since exited."""
    proc = start_sleeper()
    identity = ProcessIdentity.of(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    return identity


def _dead_owner(start_sleeper, record: str) -> ProcessIdentity | int:
    """An owner.pid naming an exited process, as an old-format bare PID or with its identity."""
    identity = _dead_identity(start_sleeper)
    return identity.pid if record == "old-format owner" else identity


def _stale_folder(root: Path, name: str, owner: ProcessIdentity | int) -> Path:
    folder = root / name
    (folder / instance_dir.PIDS_DIR).mkdir(parents=True)
    text = f"{owner}\n" if isinstance(owner, int) else owner.to_text()
    (folder / instance_dir.OWNER_FILE).write_text(text)
    return folder


def _other_start_time(identity: ProcessIdentity) -> ProcessIdentity:
    return dataclasses.replace(identity, start_ticks=identity.start_ticks - 1)


# (a) A stale pid file naming a PID that now belongs to an unrelated process.


OWNER_RECORDS = ["old-format owner", "new-format owner"]


@pytest.mark.parametrize("owner", OWNER_RECORDS)
@pytest.mark.parametrize("record", ["old-format", "other-start-time", "other-boot"])
def test_reused_child_pid_is_not_killed(tmp_path, start_sleeper, capsys, record, owner):
    stranger = start_sleeper()
    folder = _stale_folder(tmp_path, "a100-stale", _dead_owner(start_sleeper, owner))
    pid_file = folder / instance_dir.PIDS_DIR / "qemu.pid"
    if record == "old-format":
        pid_file.write_text(f"{stranger.pid}\n")
    elif record == "other-start-time":
        pid_file.write_text(_other_start_time(ProcessIdentity.of(stranger.pid)).to_text())
    else:
        other_boot = dataclasses.replace(ProcessIdentity.of(stranger.pid), boot_id="0" * 36)
        pid_file.write_text(other_boot.to_text())

    assert instance_dir.clean_stale(tmp_path) == [folder]

    assert _ended_by(stranger) == signal.SIGTERM, "clean_stale killed an unrelated process"
    assert not folder.exists()
    err = capsys.readouterr().err
    not_killed = [line for line in err.splitlines() if "not killed" in line]
    assert len(not_killed) == 1 and str(folder) in not_killed[0] and f"PID {stranger.pid}" in not_killed[0]


def test_unreadable_pid_file_kills_nothing_and_cleans(tmp_path, start_sleeper, capsys):
    folder = _stale_folder(tmp_path, "a100-stale", _dead_owner(start_sleeper, "old-format owner"))
    (folder / instance_dir.PIDS_DIR / "qemu.pid").write_text('{"pid": 12')
    assert instance_dir.clean_stale(tmp_path) == [folder]
    assert not folder.exists()
    assert "unreadable" in capsys.readouterr().err


# (b) A stale pid file whose process is provably ours: the crash clean-up the feature is for.


@pytest.mark.parametrize("owner", OWNER_RECORDS)
def test_recorded_child_of_a_dead_owner_is_killed(tmp_path, start_sleeper, capsys, owner):
    folder = _stale_folder(tmp_path, "a100-stale", _dead_owner(start_sleeper, owner))
    child = ChildProcess("qemu", ["sleep", "60"], folder / "qemu.log", folder / instance_dir.PIDS_DIR)
    try:
        assert instance_dir.clean_stale(tmp_path) == [folder]
        assert child.popen.wait(timeout=10) == -signal.SIGKILL
        assert not folder.exists()
        assert f"PID {child.pid}" in capsys.readouterr().err
    finally:
        child.stop()


def test_child_behind_an_exec_ing_wrapper_is_still_killed(tmp_path, start_sleeper):
    # Like the vfio-user prefix's qemu-system-x86_64: a shell script that execs the real
    # program, so the command line changes after it was recorded; the identity does not.
    wrapper = tmp_path / "qemu-wrapper"
    wrapper.write_text('#!/bin/sh\nexec sleep 60 "$@"\n')
    wrapper.chmod(0o755)
    folder = _stale_folder(tmp_path, "a100-stale", _dead_owner(start_sleeper, "new-format owner"))
    child = ChildProcess("qemu", [str(wrapper)], folder / "qemu.log", folder / instance_dir.PIDS_DIR)
    try:
        assert instance_dir.clean_stale(tmp_path) == [folder]
        assert child.popen.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.stop()


def test_child_record_identifies_the_exec_d_program(tmp_path):
    child = ChildProcess("nbd-gpu0", ["sleep", "60"], tmp_path / "nbd.log", tmp_path)
    try:
        record = read_pid_file(tmp_path / "nbd-gpu0.pid")
        assert record.pid == child.pid and record.identity.matches()
        assert record.identity.argv0 == "sleep"  # recorded after exec, not the parent's
    finally:
        child.stop()
    assert not (tmp_path / "nbd-gpu0.pid").exists()


# (c) owner.pid naming a live process that is not the owner: the owner is gone.


@pytest.mark.parametrize("record", ["other-start-time", "other-boot"])
def test_reused_owner_pid_does_not_keep_the_folder(tmp_path, start_sleeper, capsys, record):
    stranger = start_sleeper()
    identity = ProcessIdentity.of(stranger.pid)
    if record == "other-start-time":
        identity = _other_start_time(identity)
    else:
        identity = dataclasses.replace(identity, boot_id="0" * 36)
    folder = _stale_folder(tmp_path, "a100-stale", identity)

    assert instance_dir.clean_stale(tmp_path) == [folder]

    assert not folder.exists()
    assert _ended_by(stranger) == signal.SIGTERM
    assert f"removed stale instance folder {folder}" in capsys.readouterr().err


def test_live_owner_keeps_its_folder_and_children(tmp_path, monkeypatch, start_sleeper):
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(tmp_path))
    folder = instance_dir.make_instance_dir("a100")
    assert read_pid_file(folder / instance_dir.OWNER_FILE).identity == ProcessIdentity.of(os.getpid())
    child = start_sleeper()
    write_pid_file(folder / instance_dir.PIDS_DIR / "qemu.pid", child.pid)

    assert instance_dir.clean_stale(tmp_path) == []

    assert folder.exists()
    assert _ended_by(child) == signal.SIGTERM


def test_folder_without_owner_file_is_kept(tmp_path):
    kept = tmp_path / "a100-kept"  # remove_instance_dir(keep=True) drops owner.pid
    (kept / instance_dir.PIDS_DIR).mkdir(parents=True)
    assert instance_dir.clean_stale(tmp_path) == []
    assert kept.exists()


# -- the run root is the user's own (issue 45: a second user, a path made first by another) ------

def test_the_default_run_root_is_the_users_own(monkeypatch):
    monkeypatch.delenv("HILCONFORM_RUN_ROOT", raising=False)
    assert instance_dir.default_run_root() == Path(f"/tmp/hilc-{os.getuid()}")


def test_a_new_run_root_is_made_closed_to_others(monkeypatch, tmp_path):
    root = tmp_path / "r"
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(root))
    assert instance_dir.run_root() == root
    assert root.stat().st_mode & 0o777 == 0o700


def test_a_run_root_of_ours_open_to_others_is_tightened(monkeypatch, tmp_path):
    root = tmp_path / "r"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(root))
    instance_dir.run_root()
    assert root.stat().st_mode & 0o777 == 0o700


def test_a_run_root_that_is_a_link_is_refused(monkeypatch, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "r").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(tmp_path / "r"))
    with pytest.raises(instance_dir.RunRootUnsafe, match="is a link"):
        instance_dir.make_instance_dir("a100")


def test_a_run_root_another_user_made_is_refused(monkeypatch, tmp_path):
    """Made by another user first (here: owned by nobody, as root can arrange; skipped unless root)."""
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    root = tmp_path / "r"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(root))
    with pytest.raises(instance_dir.RunRootUnsafe, match="belongs to uid 65534"):
        instance_dir.make_instance_dir("a100")
