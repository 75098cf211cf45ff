"""EmulatedVM.pause / resume: a shared host held still between the tests that share it.

The QMP session and guest agent are stand-ins recording what they were asked, and the `host`
fixture's use of them is checked in an inner pytest run with the shared host replaced by a
recorder; the real VM path runs in every suite run on an emulated host."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

from hilconform.emulators.vm import EmulatedVM


class _Qmp:
    def __init__(self):
        self.commands = []

    def execute(self, command, arguments=None, timeout_s=10.0):
        self.commands.append(command)
        return {}


class _Agent:
    """A guest whose wall clock stood still for `behind_s` while paused; `date -s` sets it."""

    def __init__(self, behind_s: float):
        self.offset_ns, self.scripts = -int(behind_s * 1e9), []

    def shell(self, script, timeout_s=30.0):
        self.scripts.append(script)
        if script.startswith("date -s @"):
            self.offset_ns = 0
        return SimpleNamespace(exit_code=0, stderr="")

    def call(self, command):
        assert command == "guest-get-time"
        return time.time_ns() + self.offset_ns


def _vm(alive: bool = True) -> EmulatedVM:
    vm = EmulatedVM.__new__(EmulatedVM)  # no QEMU: only what pause/resume touch
    vm.profile = SimpleNamespace(name="a100")
    vm.qmp, vm.agent = _Qmp(), _Agent(behind_s=30.0)
    vm.qemu = SimpleNamespace(alive=lambda: alive)
    vm.paused, vm._stopped = False, False
    return vm


def test_a_paused_vm_is_stopped_once_and_resumed_with_its_wall_clock_put_back():
    vm = _vm()
    vm.pause()
    vm.pause()
    assert vm.qmp.commands == ["stop"] and vm.paused
    vm.resume()
    assert vm.qmp.commands == ["stop", "cont"] and not vm.paused
    assert vm.agent.scripts and vm.agent.scripts[0].startswith("date -s @")
    assert abs(vm.agent.offset_ns) < 0.1e9, "the guest's wall clock was left behind the host's"


def test_a_running_vm_is_not_resumed_and_a_dead_one_not_paused():
    running = _vm()
    running.resume()
    assert running.qmp.commands == [] and running.agent.scripts == []
    dead = _vm(alive=False)
    dead.pause()
    assert dead.qmp.commands == [] and not dead.paused


SHARED_HOST_STAND_IN = '''
import json
import pytest

CALLS = []


class FakeVM:
    def check_alive(self):
        CALLS.append("check_alive")

    def resume(self):
        CALLS.append("resume")

    def pause(self):
        CALLS.append("pause")


class FakeHost:
    vm = FakeVM()

    def use(self):
        CALLS.append("test")


@pytest.fixture(scope="session")
def _shared_host():
    yield FakeHost()
    with open("calls.json", "w") as out:
        json.dump(CALLS, out)
'''


def test_the_host_fixture_resumes_the_shared_host_for_each_test_and_pauses_it_after(tmp_path):
    """An inner pytest run (the plugin loaded, the worker's shared host replaced by a recorder):
    two read-only tests each get it checked and resumed before they use it, paused after."""
    (tmp_path / "conftest.py").write_text(SHARED_HOST_STAND_IN)
    (tmp_path / "test_two.py").write_text("def test_one(host):\n    host.use()\n\n\n"
                                          "def test_two(host):\n    host.use()\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "hilconform.fixtures.plugin", "-p",
                           "no:cacheprovider", "-q", "--host", "emulated:a100", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = json.loads((tmp_path / "calls.json").read_text())
    assert calls == ["check_alive", "resume", "test", "pause"] * 2, calls
