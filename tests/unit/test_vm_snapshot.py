"""Saved ready VMs (emulators/vm_snapshot.py) without a VM: what makes two VMs the same, what is
never saved, the store's limit, and a device model's card carried across a save."""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hilconform.emulators import vm_snapshot
from hilconform.emulators.process_identity import ProcessIdentity, read_pid_file
from hilconform.emulators.vfio_user.device import ModelDevice
from hilconform.emulators.vfio_user.model import load_model

COMMAND, BAR0 = 0x04, 0x10


def test_the_configuration_key_changes_with_the_command_line_the_share_and_the_boot_files(tmp_path):
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"k")
    key = vm_snapshot.configuration_key(["qemu", "-m", "512"], {"runtime.toml": b"a"}, [kernel])
    assert key == vm_snapshot.configuration_key(["qemu", "-m", "512"], {"runtime.toml": b"a"}, [kernel])
    assert key != vm_snapshot.configuration_key(["qemu", "-m", "1024"], {"runtime.toml": b"a"}, [kernel])
    assert key != vm_snapshot.configuration_key(["qemu", "-m", "512"], {"runtime.toml": b"b"}, [kernel])
    assert key != vm_snapshot.configuration_key(["qemu", "-m", "512"], {"runtime.module": b"a"}, [kernel])
    kernel.write_bytes(b"a new kernel")
    assert key != vm_snapshot.configuration_key(["qemu", "-m", "512"], {"runtime.toml": b"a"}, [kernel])


def _fake_save(vm, key: str, stream: Path):
    """vm_snapshot.save without a VM: a stream of six bytes."""
    stream.write_bytes(b"stream")
    return vm_snapshot.SavedVM(key, stream, {}, "", 6)


class _Qmp:
    def __init__(self, blocked: list[str]):
        self.blocked = blocked

    def execute(self, command, arguments=None, timeout_s=None):
        assert command == "query-migrate"
        return {"blocked-reasons": self.blocked} if self.blocked else {}


def _vm(blocked: list[str] = ()):
    return SimpleNamespace(qmp=_Qmp(list(blocked)))


def test_a_vm_qemu_cannot_migrate_is_never_saved_and_qemus_reason_is_kept(monkeypatch):
    monkeypatch.setattr(vm_snapshot, "save", lambda vm, key, stream: pytest.fail("tried to save"))
    saved = vm_snapshot.SavedVMs()
    assert saved.remember(_vm(["non-migratable device: 0000:00:10.0:00.0/nvme"]), "k1") is None
    assert saved.get("k1") is None
    assert saved.why_booted == {"k1": "non-migratable device: 0000:00:10.0:00.0/nvme"}
    assert saved.remember(_vm(), "k1") is None  # asked once per configuration


def test_the_store_keeps_its_limit_and_removes_the_oldest_stream(monkeypatch, tmp_path):
    monkeypatch.setattr(vm_snapshot, "save", _fake_save)
    saved = vm_snapshot.SavedVMs(limit=2)
    monkeypatch.setattr(saved, "folder", lambda: tmp_path)
    first = saved.remember(_vm(), "a" * 20)
    saved.remember(_vm(), "b" * 20)
    assert saved.remember(_vm(), "a" * 20) is first  # saved once
    saved.remember(_vm(), "c" * 20)
    assert saved.get("a" * 20) is None and not first.stream.exists()
    assert saved.get("b" * 20) and saved.get("c" * 20)


def test_a_card_is_carried_across_a_save_and_outlives_qemus_first_reset():
    model = load_model("a100-sxm4")
    card = ModelDevice(model, "gpu0")
    try:
        card.region_write(7, BAR0, struct.pack("<I", 0xFB000000))  # the guest's configuration
        card.region_write(7, COMMAND, struct.pack("<H", 0x0006))
        card.registers.scratch = 0x1234
        memfd_bar = next(bar.index for bar in model.bars if bar.backing == "memfd")
        card.region_write(memfd_bar, 4096, b"guest data")
        state = card.saved_state()
    finally:
        card.close()

    restored = ModelDevice(model, "gpu0")
    try:
        restored.load_state(state)
        restored.device_reset()  # QEMU's machine reset before it loads the stream
        assert restored.region_read(7, BAR0, 4) == struct.pack("<I", 0xFB000000)
        assert restored.config.memory_decoding and restored.registers.scratch == 0x1234
        assert restored.region_read(memfd_bar, 4096, 10) == b"guest data"
        restored.device_reset()  # a later reset is the guest's own: it clears the card
        assert not restored.config.memory_decoding and restored.registers.scratch == 0
    finally:
        restored.close()


def test_a_card_with_work_in_flight_or_a_fault_is_not_saved():
    card = ModelDevice(load_model("a100-sxm4"), "gpu0")
    try:
        card.fall_off_bus()
        with pytest.raises(ValueError, match="not saved"):
            card.saved_state()
    finally:
        card.close()


def test_a_vm_one_process_saved_in_the_shared_folder_is_restorable_by_another(monkeypatch, tmp_path):
    def fake_save(vm, key: str, stream: Path):
        stream.write_bytes(b"stream")
        return vm_snapshot.SavedVM(key, stream, {"gpu0": {"config": b"\x01"}}, "-s 01:00.0 COMMAND=6", 6)

    monkeypatch.setattr(vm_snapshot, "save", fake_save)
    saver, other = vm_snapshot.SavedVMs(shared=tmp_path), vm_snapshot.SavedVMs(shared=tmp_path)
    assert other.get("k" * 64) is None
    saved = saver.remember(_vm(), "k" * 64)
    assert saved.stream.parent == tmp_path
    assert other.get("k" * 64) == saved  # the stream, the cards and the registers
    assert other.remember(_vm(), "k" * 64) == saved  # not saved twice
    assert len(list(tmp_path.glob("*.stream"))) == 1
    assert not list(tmp_path.glob("*.partial"))
    saver.clear()
    assert saved.stream.exists(), "a process's clear leaves the run's shared saves alone"


def test_past_the_shared_folders_bound_a_save_stays_private(monkeypatch, tmp_path):
    monkeypatch.setattr(vm_snapshot, "save", _fake_save)
    monkeypatch.setattr(vm_snapshot, "SHARED_MAX_BYTES", 6)
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir(), private.mkdir()
    saver = vm_snapshot.SavedVMs(shared=shared)
    monkeypatch.setattr(saver, "folder", lambda: private)
    saver.remember(_vm(), "a" * 64)
    second = saver.remember(_vm(), "b" * 64)
    assert second.stream.parent == private
    assert vm_snapshot.SavedVMs(shared=shared).get("b" * 64) is None
    assert saver.get("b" * 64) == second


def test_sharing_is_inherited_and_ended_by_whoever_started_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(tmp_path))
    monkeypatch.delenv(vm_snapshot.SHARED_ENV, raising=False)
    monkeypatch.setattr(vm_snapshot, "_process_saved", None)  # put back afterwards
    folder = vm_snapshot.share_saved_vms()
    assert folder is not None and os.environ[vm_snapshot.SHARED_ENV] == str(folder)
    assert vm_snapshot.saved_vms().shared == folder
    assert vm_snapshot.share_saved_vms() is None  # a child of a sharing process shares its folder
    vm_snapshot.stop_sharing(folder)
    assert not folder.exists() and vm_snapshot.SHARED_ENV not in os.environ


def _claim_of(path: Path, pid: int) -> None:
    path.write_text(ProcessIdentity.of(pid).to_text())


def test_a_configuration_another_process_is_booting_is_waited_for_then_restored(monkeypatch, tmp_path):
    monkeypatch.setattr(vm_snapshot, "save", _fake_save)
    monkeypatch.setattr(vm_snapshot, "CLAIM_POLL_S", 0.01)
    key = "k" * 64
    booter = subprocess.Popen(["sleep", "30"])  # stands for the other worker, alive while it boots
    try:
        _claim_of(tmp_path / (key + vm_snapshot.CLAIM_SUFFIX), booter.pid)
        saver, waiter = vm_snapshot.SavedVMs(shared=tmp_path), vm_snapshot.SavedVMs(shared=tmp_path)
        timer = threading.Timer(0.3, lambda: saver.remember(_vm(), key))
        timer.start()
        started = time.monotonic()
        saved = waiter.restorable(key, wait_s=20)
        timer.join()
        assert saved is not None and saved.key == key and time.monotonic() - started >= 0.25
        assert waiter.restorable(key, wait_s=0) == saved
    finally:
        booter.kill()
        booter.wait()


def test_the_first_process_claims_a_configuration_and_releases_only_its_own_claim(tmp_path):
    key = "k" * 64
    first, second = vm_snapshot.SavedVMs(shared=tmp_path), vm_snapshot.SavedVMs(shared=tmp_path)
    claim = tmp_path / (key + vm_snapshot.CLAIM_SUFFIX)
    assert first.restorable(key, wait_s=0) is None and claim.exists()  # ours: this process boots
    assert second.restorable(key, wait_s=0) is None  # the same process: never waits on itself
    first.release(key)
    assert not claim.exists()
    other = subprocess.Popen(["sleep", "30"])
    try:
        _claim_of(claim, other.pid)
        assert first.restorable(key, wait_s=0.05) is None  # gave up waiting: boots beside it
        first.release(key)
        assert claim.exists(), "a claim of another process was released"
    finally:
        other.kill()
        other.wait()


def test_a_claim_whose_process_is_gone_is_taken_over(tmp_path):
    key = "k" * 64
    gone = subprocess.Popen(["true"])
    identity = ProcessIdentity.of(gone.pid)
    gone.wait()
    claim = tmp_path / (key + vm_snapshot.CLAIM_SUFFIX)
    claim.write_text(identity.to_text())
    started = time.monotonic()
    assert vm_snapshot.SavedVMs(shared=tmp_path).restorable(key, wait_s=20) is None
    assert time.monotonic() - started < 5, "waited on a claim nobody holds"
    assert read_pid_file(claim).pid == os.getpid()


def test_a_configuration_never_saved_is_booted_at_once_by_every_process_with_why(tmp_path):
    key = "k" * 64
    finder, other = vm_snapshot.SavedVMs(shared=tmp_path), vm_snapshot.SavedVMs(shared=tmp_path)
    assert finder.remember(_vm(["non-migratable device: nvme"]), key) is None
    assert other.restorable(key, wait_s=0) is None
    assert other.why_booted == {key: "non-migratable device: nvme"}
    assert not (tmp_path / (key + vm_snapshot.CLAIM_SUFFIX)).exists()


class _LateGuest:
    """A guest agent whose commands run `lag_s` late (a loaded machine): its clock, set to the
    host's time as sent, ends up `lag_s` behind until a relative step puts it right."""

    def __init__(self, lag_s: float):
        self.offset_ns, self.lag_ns, self.commands = 0, int(lag_s * 1e9), []

    def shell(self, script: str, timeout_s: float = 30.0):
        self.commands.append(script)
        if script.startswith("date -s @"):
            self.offset_ns = -self.lag_ns
        elif script.startswith("n=$(( $(date +%s%N) + "):
            self.offset_ns += int(script.split("+ ", 1)[1].split(" ))", 1)[0])
        return SimpleNamespace(exit_code=0, stderr="")

    def call(self, command: str):
        assert command == "guest-get-time"
        return time.time_ns() + self.offset_ns


def test_a_restored_guest_whose_clock_command_ran_late_is_stepped_right_before_its_runtime_runs():
    agent = _LateGuest(lag_s=1.5)
    vm_snapshot.resume_guest(SimpleNamespace(agent=agent), vm_snapshot.SavedVM("k", Path("s"), {}, ""))
    assert abs(agent.offset_ns) < 0.1e9
    assert len(agent.commands) == 3 and "kill -CONT" in agent.commands[-1]


def test_a_restored_guest_whose_clock_is_right_is_not_stepped():
    agent = _LateGuest(lag_s=0.0)
    vm_snapshot.resume_guest(SimpleNamespace(agent=agent), vm_snapshot.SavedVM("k", Path("s"), {}, ""))
    assert len(agent.commands) == 2


def test_a_wait_for_another_process_boot_is_used_once_and_a_free_configuration_claimed(monkeypatch, tmp_path):
    """`restorable(..., while_waiting)`: called once when the process has to wait (the host factory
    boots the other hot-plug mode then), not when it boots or restores at once; `claim_if_free`
    claims only a configuration nobody saved, claims or gave up on."""
    monkeypatch.setattr(vm_snapshot, "save", _fake_save)
    monkeypatch.setattr(vm_snapshot, "CLAIM_POLL_S", 0.01)
    key, other_key = "k" * 64, "o" * 64
    booter = subprocess.Popen(["sleep", "30"])
    try:
        _claim_of(tmp_path / (key + vm_snapshot.CLAIM_SUFFIX), booter.pid)
        saver, waiter = vm_snapshot.SavedVMs(shared=tmp_path), vm_snapshot.SavedVMs(shared=tmp_path)
        used = []

        def use_the_wait():
            used.append(waiter.claim_if_free(other_key))
            assert not waiter.claim_if_free(key), "claimed a configuration another process is booting"
            waiter.release(other_key)
            saver.remember(_vm(), key)  # the other process's save lands meanwhile

        saved = waiter.restorable(key, wait_s=20, while_waiting=use_the_wait)
        assert saved is not None and saved.key == key and used == [True]
        assert waiter.restorable(key, while_waiting=lambda: used.append("again")) == saved
        assert used == [True], "called without a wait"
        assert not waiter.claim_if_free(key), "claimed a saved configuration"
        waiter.never_saved(other_key, "QEMU says no")
        assert not vm_snapshot.SavedVMs(shared=tmp_path).claim_if_free(other_key), "claimed one given up on"
    finally:
        booter.kill()
        booter.wait()


class _BareVM:
    """An EmulatedVM without a runtime, as start_bare_vm sees it: its key, and how it started."""

    def __init__(self, ssh: str | None = None):
        self.runtime_config, self.ssh_authorized_key, self.made_by = None, ssh, None
        self.qmp = _Qmp([])

    def configuration_key(self):
        return "b" * 64

    def start(self, restore=None):
        self.made_by = "restore" if restore is not None else "boot"
        return self


def test_a_vm_without_a_runtime_boots_once_per_run_then_is_restored(monkeypatch, tmp_path):
    monkeypatch.setattr(vm_snapshot, "save", _fake_save)
    monkeypatch.setattr(vm_snapshot, "_process_saved", vm_snapshot.SavedVMs(shared=tmp_path))
    assert vm_snapshot.start_bare_vm(_BareVM()).made_by == "boot"
    assert vm_snapshot.start_bare_vm(_BareVM()).made_by == "restore"
    assert not list(tmp_path.glob("*" + vm_snapshot.CLAIM_SUFFIX)), "a claim was left behind"
    assert vm_snapshot.start_bare_vm(_BareVM(ssh="ssh-ed25519 AAAA")).made_by == "boot"  # root writable
    with_runtime = _BareVM()
    with_runtime.runtime_config = "name = 'x'\n"
    with pytest.raises(ValueError, match="without a runtime"):
        vm_snapshot.start_bare_vm(with_runtime)
