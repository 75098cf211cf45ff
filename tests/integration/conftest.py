"""Fixtures shared by the integration modules."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest
from stand_in_real_host import StandInHost, start_stand_in

PCIWATCH_BUILD = Path(__file__).resolve().parents[1] / "plugins" / "pciwatch" / "build.py"


@pytest.fixture(scope="session")
def pciwatch() -> dict[str, Path]:
    """The frozen plugin, its 64 MiB copy and its images (built once, cached under build/plugins/):
    tests/plugins/pciwatch, certified on emulated hosts (test_plugins_as_shipped) and on the
    stand-in real host (test_real_host)."""
    lock = PCIWATCH_BUILD.parents[3] / "build" / "pciwatch.lock"  # one build at a time (xdist workers)
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, str(PCIWATCH_BUILD), "--size-mib", "64", "--images"],
                              capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"building pciwatch failed:\n{done.stderr}"
    frozen, grown, oci, docker = (Path(line) for line in done.stdout.split())
    return {"frozen": frozen, "64m": grown, "oci": oci, "docker": docker}


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory) -> StandInHost:
    """The a100-stock guest as a stand-in real host, booted once per worker for every module that
    drives the real-host backend against it (test_real_host, test_real_host_bad_input): a boot
    with sshd is ~15 s and cannot be restored (its root file system stays writable). Each test
    puts back what it changes; a module that needs another profile defines its own."""
    host = start_stand_in(tmp_path_factory.mktemp("stand-in"))
    yield host
    host.vm.stop()


@pytest.fixture(autouse=True)
def _stand_in_paused_after(request):
    """The session's stand-in held still after each test that used it (EmulatedVM.pause: an idle
    guest costs ~4% of a host core under TCG, for the rest of the session); its next use wakes it
    (StandInHost.awake)."""
    yield
    if "stand_in" in request.fixturenames:
        request.getfixturevalue("stand_in").vm.pause()
