"""Lab runs on a real labgrid (issue 35): a coordinator and one exporter per host on this machine,
two stand-in lab hosts (emulated guests with sshd: to hilconform real hosts over SSH), places made
and tagged with labgrid's own client. Checked: a nightly `hilconform lab run` certifies both and
writes the night's record and fleet report; a place another user holds is skipped, the holder
named, and left held; a run killed outright leaves no lock of its own (its guardian gives the
place back); an exporter stopped mid-run makes its host incomplete and the other is certified.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labgrid_bed import LabBed
from stand_in_real_host import start_stand_in

from hilconform.reports.lab_night import read_night

pytest.importorskip("labgrid", reason="labgrid is the [lab] extra: pip install 'hilconform[lab]'")

ROOT = Path(__file__).resolve().parents[2]
TAGS = {"gpu": "a100", "lab": "nightly", "profile": "emulated-guest"}
CLAUSES = ["--clause", "DISC-01", "--clause", "REAL-01"]  # read-only, quick on a stand-in
RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    hosts = {}
    bed = LabBed(folder)
    try:
        for name in ("lab-a", "lab-b"):
            (folder / name).mkdir()
            hosts[name] = start_stand_in(folder / name)
        bed.start()
        for name, host in hosts.items():
            bed.export(name, host.vm.ssh_port)
            bed.make_place(name, name, **TAGS)
        bed.hosts = hosts
        yield bed
    finally:
        bed.stop()
        for host in hosts.values():
            host.vm.stop()


def _ssh_config(bed: LabBed, tmp_path: Path) -> Path:
    """One ssh_config offering both stand-ins' keys."""
    config = tmp_path / "ssh_config"
    keys = "".join(f"  IdentityFile {h.key}\n" for h in bed.hosts.values())
    config.write_text(f"Host *\n{keys}  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                      "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    return config


def _lab_run(bed: LabBed, night: Path, tmp_path: Path, *extra: str, wait: bool = True):
    argv = [sys.executable, "-m", "hilconform.reports", "lab", "run", "gpu=a100", "lab=nightly",
            "--lg-coordinator", bed.address, "--out", str(night), *CLAUSES, *extra,
            "--", "--ssh-config", str(_ssh_config(bed, tmp_path))]
    if not wait:
        return subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_a_night_certifies_both_hosts_and_a_held_place_is_skipped_with_its_holder(lab, tmp_path):
    first = tmp_path / "night-1"
    done = _lab_run(lab, first, tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    night = read_night(first)
    assert {h.place: h.status for h in night.hosts} == {"lab-a": "certified", "lab-b": "certified"}
    assert all(h.verdict in ("conformant", "partial") for h in night.hosts)
    assert "[lab-a]" in done.stdout and "[lab-b]" in done.stdout  # progress per host
    assert lab.holder("lab-a") is None and lab.holder("lab-b") is None  # no lock outlives the run

    lab.client("-p", "lab-b", "acquire", user="bob")
    try:
        second = tmp_path / "night-2"
        done = _lab_run(lab, second, tmp_path, "--previous", str(first))
        assert done.returncode == 2, done.stdout[-6000:]  # a host not certified: the worst verdict
        night = read_night(second)
        statuses = {h.place: (h.status, h.reason) for h in night.hosts}
        assert statuses["lab-a"][0] == "certified"
        assert statuses["lab-b"][0] == "held" and "/bob" in statuses["lab-b"][1], statuses
        assert lab.holder("lab-b").endswith("/bob")  # never taken from its holder
        assert lab.holder("lab-a") is None
    finally:
        lab.client("-p", "lab-b", "release", user="bob")
    fleet = json.loads((second / "fleet.json").read_text())
    text = json.dumps(fleet)
    assert "lab-a" in text and "lab-b" in text and "held" in text
    assert str(first.name) in text  # the previous night is side by side with this one
    dom = _rendered(second / "fleet.html", tmp_path)
    assert "lab-a" in dom and "lab-b" in dom and "held by" in dom  # trend plots: test_fleet_report.py


def _rendered(page: Path, tmp_path: Path) -> str:
    """The page's DOM as a real headless browser built it (Debian's chromium)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make setup installs it)")
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=5000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_run_killed_outright_leaves_no_lock_of_its_own(lab, tmp_path):
    argv = [sys.executable, "-m", "hilconform.reports", "certify", "--host", "labgrid:lab-a",
            "--lg-coordinator", lab.address, "--out", str(tmp_path / "runs"), *CLAUSES,
            "--", "--ssh-config", str(_ssh_config(lab, tmp_path))]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while lab.holder("lab-a") is None:
            assert proc.poll() is None, f"certify ended (exit {proc.returncode}) before it held the place"
            assert time.monotonic() < deadline, "certify never took labgrid place lab-a"
            time.sleep(0.5)
        holder = lab.holder("lab-a")
        os.killpg(proc.pid, signal.SIGKILL)  # certify and everything in its process group, no cleanup
        proc.wait()
        deadline = time.monotonic() + 60
        while lab.holder("lab-a") is not None:
            assert time.monotonic() < deadline, f"labgrid place lab-a still held by {lab.holder('lab-a')}"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    me = (f"{os.environ.get('LG_HOSTNAME', socket.gethostname())}/"
          f"{os.environ.get('LG_USERNAME', getpass.getuser())}")
    assert holder == me  # it was this run's own lock that went


def test_an_exporter_stopped_mid_run_makes_its_host_incomplete_and_the_other_certified(lab, tmp_path):
    night = tmp_path / "night"
    proc = _lab_run(lab, night, tmp_path, "--max-parallel", "2", wait=False)
    output = []
    try:
        for line in proc.stdout:  # stop lab-b's exporter once its certify is running tests
            output.append(line)
            if line.startswith("[lab-b]") and "run folder" in line:
                lab.stop_exporter("lab-b")
                break
        output += proc.stdout.readlines()
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(output)
    assert proc.returncode == 2 and (night / "lab-run.json").is_file(), text[-6000:]
    hosts = {h.place: h for h in read_night(night).hosts}
    assert hosts["lab-a"].status == "certified", text[-6000:]
    assert hosts["lab-b"].status == "incomplete" and "exporter" in hosts["lab-b"].reason, hosts["lab-b"]
    assert lab.holder("lab-a") is None and lab.holder("lab-b") is None
