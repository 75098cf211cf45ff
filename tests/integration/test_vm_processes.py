"""No QEMU or qemu-nbd outlives its owner: normal stop, Ctrl-C, and a killed worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hilconform.emulators.errors import InfrastructureError
from hilconform.emulators.process_identity import read_pid_file
from hilconform.emulators.profile import load_profile
from hilconform.emulators.vm import EmulatedVM

OWNER_SCRIPT = """
import faulthandler, json, signal, sys, time
# A shell that starts a job in the background (`cmd &`, nohup) makes it ignore SIGINT, and Python
# keeps an inherited SIG_IGN: give the owner the Ctrl-C behaviour a terminal user's process has.
signal.signal(signal.SIGINT, signal.default_int_handler)
from hilconform.emulators.profile import load_profile
from hilconform.emulators.vm import EmulatedVM
vm = EmulatedVM(load_profile("t4-stock")).start()
print(json.dumps({"pids": vm.pids, "folder": str(vm.layout.folder)}), flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    faulthandler.dump_traceback_later(20)  # a stop that hangs says where (stderr)
    sys.exit(130)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_stop_ends_every_process_and_removes_the_folder():
    vm = EmulatedVM(load_profile("t4-stock")).start()
    pids, folder = vm.pids, vm.layout.folder
    assert len(pids) == 3  # QEMU and two NBD queue backends
    records = [read_pid_file(path) for path in vm.layout.pids.glob("*.pid")]
    assert sorted(r.pid for r in records) == sorted(pids)
    assert all(r.identity is not None and r.identity.matches() for r in records), records
    vm.stop()
    assert _wait_gone(pids, 10) == []
    assert not folder.exists()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_owner_death_ends_every_process(how):
    owner = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line, "the owner process did not start its VM"
        started = json.loads(line)
        assert all(_alive(p) for p in started["pids"])
        owner.send_signal(how)
        try:
            owner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            owner.kill()
            _out, err = owner.communicate(timeout=10)
            pytest.fail(f"the owner did not exit within 30 s of {how.name}; its stderr:\n{err[-6000:]}")
        assert _wait_gone(started["pids"], 15) == [], f"survivors after {how.name}"
        if how == signal.SIGINT:
            assert not Path(started["folder"]).exists()
    finally:
        if owner.poll() is None:
            owner.kill()


def test_qemu_failing_to_start_leaves_nothing_running(monkeypatch, tmp_path):
    monkeypatch.setenv("HILCONFORM_QEMU_SYSTEM_X86_64", "/bin/false")
    vm = EmulatedVM(load_profile("t4-stock"))
    with pytest.raises(InfrastructureError, match="exited with status 1"):
        vm.start()
    pids = [b.process.pid for b in vm.queues.values()]
    assert pids and _wait_gone(pids, 10) == []
    assert not vm.layout.folder.exists()
