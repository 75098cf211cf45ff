"""A labgrid place held for a run (fixtures/labgrid_lock.py) against a real coordinator and
exporter, no VM: the NetworkService read, a place this identity holds used and not given back, a
place another user holds refused with the holder named, the guardian's release when the process
that took the place is killed outright, reservations, and `--host labgrid:` errors before any test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from labgrid_bed import LabBed

from hilconform.fixtures.labgrid_lab import Lab, NotReserved, PlaceHeld, PlaceUnknown
from hilconform.fixtures.labgrid_lock import PlaceLock

pytest.importorskip("labgrid", reason="labgrid is the [lab] extra: pip install 'hilconform[lab]'")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    bed = LabBed(tmp_path_factory.mktemp("labgrid")).start()
    try:
        bed.export("lab-a", 2201)
        bed.export("lab-b", 2202)
        bed.make_place("lab-a", "lab-a", gpu="a100", lab="nightly", profile="emulated-guest")
        bed.make_place("lab-b", "lab-b", gpu="a100", lab="nightly")
        yield bed
    finally:
        bed.stop()


def test_a_place_is_held_for_the_run_and_given_back_only_by_who_took_it(bed):
    lock = PlaceLock(bed.address, "lab-a").take()
    try:
        assert lock.took and lock.target.spec == "ssh://root@127.0.0.1:2201"
        assert lock.profile == "emulated-guest"
        inner = PlaceLock(bed.address, "lab-a").take()  # certify's pytest run finds it held by us
        assert not inner.took
        inner.release()
        assert bed.holder("lab-a") == lock_holder(bed)  # still held: the inner user did not take it
    finally:
        lock.release()
    assert bed.holder("lab-a") is None


def lock_holder(bed) -> str:
    with Lab(bed.address) as lab:
        return lab.identity


def test_a_place_another_user_holds_is_refused_with_the_holder_named_and_left_held(bed):
    bed.client("-p", "lab-b", "acquire", user="bob")
    try:
        with pytest.raises(PlaceHeld, match="held by .*/bob"):
            PlaceLock(bed.address, "lab-b").take()
        assert bed.holder("lab-b").endswith("/bob")
    finally:
        bed.client("-p", "lab-b", "release", user="bob")


def test_the_guardian_gives_the_place_back_when_its_taker_is_killed_outright(bed):
    taker = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom hilconform.fixtures.labgrid_lock import PlaceLock\n"
         f"PlaceLock({bed.address!r}, 'lab-b').take()\nprint('held', flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert taker.stdout.readline().strip() == "held"
        assert bed.holder("lab-b") == lock_holder(bed)
        os.killpg(taker.pid, signal.SIGKILL)  # the taker and its process group: no finally runs
        taker.wait()
        deadline = time.monotonic() + 30
        while bed.holder("lab-b") is not None:
            assert time.monotonic() < deadline, "the guardian did not give labgrid place lab-b back"
            time.sleep(0.3)
    finally:
        if taker.poll() is None:
            taker.kill()
            taker.wait()


def test_a_reservation_is_allocated_or_cancelled_at_its_deadline(bed):
    with Lab(bed.address) as lab:
        assert lab.matching({"gpu": "a100", "lab": "nightly"}) == ["lab-a", "lab-b"]
        token = lab.reserve("lab-a", {"gpu": "a100"}, deadline_s=30)
        try:
            with pytest.raises(NotReserved, match="lab-a was not reserved within 3 s"):
                lab.reserve("lab-a", {"gpu": "a100"}, deadline_s=3)  # ours already: another waits
        finally:
            lab.cancel(token)
        with pytest.raises(PlaceUnknown, match="no place 'lab-z'"):
            lab.place("lab-z")


def test_host_labgrid_errors_end_the_run_before_any_test_with_status_2(bed, tmp_path):
    bed.client("-p", "lab-b", "acquire", user="bob")
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--host",
                               "labgrid:lab-b", "--lg-coordinator", bed.address, "suites/smoke"],
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              capture_output=True, text=True, timeout=120)
    finally:
        bed.client("-p", "lab-b", "release", user="bob")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "labgrid place lab-b is held by" in done.stdout + done.stderr
