"""The runtime's own resource errors are inconclusive checks, never device verdicts.

The subprocess tests (test_runtime_abuse.py) exhaust a real runtime's fds;
these drive each path that turns an OSError into a verdict (health poll,
allocate and release checkpoints, hot-add self-check, drain) in-process, with
runtime/sysfs.py seeing EMFILE for the files chosen.
"""

from __future__ import annotations

import builtins
import errno
import os
import time

import pytest
from test_service import Harness

from hilconform.runtime import procedures, protocol
from hilconform.runtime import sysfs as sysfs_module
from hilconform.runtime.device_classes import ClassHooks, DeviceUnreachable
from hilconform.runtime.own_resources import OwnResourcesShort, is_own_resource_error

_FD_CALLS = ("open", "listdir", "readlink", "stat")


def _emfile(path) -> OSError:
    return OSError(errno.EMFILE, "Too many open files", str(path))


class OutOfFds:
    """``os`` and ``open`` as runtime/sysfs.py sees them while the process has no fd left
    (every path, or only paths containing ``only``)."""

    def __init__(self) -> None:
        self.on = False
        self.only: str | None = None

    def hits(self, path) -> bool:
        return self.on and (self.only is None or self.only in str(path))

    def __getattr__(self, name: str):
        real = getattr(os, name)
        if name not in _FD_CALLS:
            return real

        def call(path, *args, **kwargs):
            if self.hits(path):
                raise _emfile(path)
            return real(path, *args, **kwargs)

        return call

    def open_file(self, path, *args, **kwargs):
        """The builtin open (os.open goes through __getattr__)."""
        if self.hits(path):
            raise _emfile(path)
        return builtins.open(path, *args, **kwargs)


@pytest.fixture
def out_of_fds(monkeypatch):
    fds = OutOfFds()
    monkeypatch.setattr(sysfs_module, "os", fds)
    monkeypatch.setattr(sysfs_module, "open", fds.open_file, raising=False)
    return fds


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.stop()


def _healthy(harness: Harness, **start):
    harness.add_nvme()
    harness.start(**start)
    client = harness.client()
    client.wait_state(Harness.NVME, "HEALTHY")
    return client


def _health_moves(client) -> list[tuple[str, str, str]]:
    return [(t["from"], t["to"], t["cause"]) for t in client.events("transition", view="health")]


@pytest.mark.parametrize(
    ("exc", "own"),
    [
        (OSError(errno.EMFILE, "x"), True),
        (OSError(errno.ENFILE, "x"), True),
        (OSError(errno.ENOMEM, "x"), True),
        (OSError(errno.ENOBUFS, "x"), True),
        (MemoryError(), True),
        (OwnResourcesShort("config read", OSError(errno.EMFILE, "x")), True),
        (OSError(errno.EIO, "x"), False),
        (OSError(errno.ENOENT, "x"), False),
        (OSError(errno.EACCES, "x"), False),
        (OSError("no errno"), False),
        (DeviceUnreachable("reads all ones"), False),
        (ValueError("x"), False),
    ],
)
def test_which_errors_describe_the_runtime(exc, own):
    assert is_own_resource_error(exc) is own


def test_sysfs_reads_raise_inconclusive_instead_of_reading_as_absent(tmp_path, out_of_fds):
    h = Harness(tmp_path)
    h.add_nvme()
    sysfs = h.fake.sysfs
    out_of_fds.on = True
    for read in (
        lambda: sysfs.read_config(Harness.NVME),
        lambda: sysfs.attr(Harness.NVME, "vendor"),
        lambda: sysfs.driver(Harness.NVME),
        lambda: sysfs.msi_irqs(Harness.NVME),
        lambda: sysfs.read_mmio(Harness.NVME, 0),
        lambda: sysfs.exists(Harness.NVME),
        lambda: sysfs.pci_addresses(),
        lambda: sysfs.glob("sys", "bus", "pci", "devices", "*"),
        lambda: sysfs.aer_counters(Harness.NVME),
    ):
        with pytest.raises(OwnResourcesShort):
            read()
    out_of_fds.on = False
    assert sysfs.exists(Harness.NVME) and sysfs.driver(Harness.NVME) == "nvme"


def test_health_poll_without_fds_keeps_the_state_and_says_so(harness, out_of_fds):
    c = _healthy(harness)
    out_of_fds.on = True
    polled = c.ok("health_poll")["devices"][Harness.NVME]
    assert polled["state"] == "HEALTHY" and polled["skipped"].startswith("inconclusive:"), polled
    out_of_fds.on = False
    assert c.ok("health_poll")["devices"][Harness.NVME]["checkpoint"]["ok"] is True
    assert ("HEALTHY", "FAULTED", "config_lost") not in _health_moves(c)
    assert c.ok("stats")["inconclusive_checks"] >= 1


def test_periodic_polls_without_fds_never_fault(harness, out_of_fds):
    c = _healthy(harness, health_poll_ms=20)
    out_of_fds.on = True
    time.sleep(0.3)
    out_of_fds.on = False
    time.sleep(0.1)
    assert [m for m in _health_moves(c) if m[0] == "HEALTHY"] == []
    assert c.ok("device", {"device": Harness.NVME})["state"] == "HEALTHY"


def test_allocate_without_fds_is_resource_exhausted_and_changes_nothing(harness, out_of_fds):
    c = _healthy(harness)
    out_of_fds.on = True
    reply = c.call("allocate", {"device": Harness.NVME})
    out_of_fds.on = False
    assert reply["error"]["code"] == protocol.RESOURCE_EXHAUSTED, reply
    assert c.ok("leases")["leases"] == []
    assert c.ok("device", {"device": Harness.NVME})["state"] == "HEALTHY"
    assert c.ok("allocate", {"device": Harness.NVME})["devices"] == [Harness.NVME]


def test_release_without_fds_stays_released_until_a_poll_can_check(harness, out_of_fds):
    c = _healthy(harness)
    lease = c.ok("allocate", {"device": Harness.NVME})
    out_of_fds.on = True
    c.ok("release", {"lease": lease["lease"]})
    assert c.ok("device", {"device": Harness.NVME})["state"] == "RELEASED"
    c.ok("health_poll")  # still no fds: still RELEASED, not FAULTED
    assert c.ok("device", {"device": Harness.NVME})["state"] == "RELEASED"
    out_of_fds.on = False
    c.ok("health_poll")
    assert c.ok("device", {"device": Harness.NVME})["state"] == "HEALTHY"
    assert ("RELEASED", "HEALTHY", f"release_checkpoint:release:{lease['lease']}") in _health_moves(c)


def test_hot_add_that_cannot_be_described_is_described_on_a_later_poll(harness, out_of_fds):
    harness.start(health_poll_ms=50)
    c = harness.client()
    harness.add_nvme()
    out_of_fds.on = True
    harness.source.emit("add", Harness.NVME)
    time.sleep(0.3)
    assert not c.events("discovered")
    out_of_fds.on = False
    c.wait_state(Harness.NVME, "HEALTHY")


def test_hot_add_self_check_without_fds_stays_discovered_and_is_tried_again(harness, out_of_fds):
    harness.start(health_poll_ms=50)
    c = harness.client()
    harness.add_nvme()
    out_of_fds.on, out_of_fds.only = True, "firmware_rev"  # the firmware step cannot read
    harness.source.emit("add", Harness.NVME)
    end = c.wait_event("procedure", procedure="hot_add", step="end")
    assert end["status"] == "failed" and end["inconclusive"] is True and end["failed_step"] == "firmware"
    assert c.ok("device", {"device": Harness.NVME})["state"] == "DISCOVERED"
    out_of_fds.on = False
    c.wait_state(Harness.NVME, "HEALTHY")
    assert ("DISCOVERED", "FAULTED") not in [m[:2] for m in _health_moves(c)]


class _BlindHooks(ClassHooks):
    """A queue probe that cannot look: the runtime has no fd to read the queue with."""

    def queue_depth(self, sysfs, bdf):
        raise OwnResourcesShort("queue", _emfile("inflight"))


def test_drain_that_cannot_look_is_not_known_empty_until_its_deadline(tmp_path):
    result = procedures.drain(_BlindHooks(), None, "0000:01:00.0", 0.05, 0.01, lambda: False)
    assert result["status"] == "timeout" and result["inconclusive"] is True and result["polls"] > 1
