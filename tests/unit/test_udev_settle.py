"""wait_udev_settled (fixtures/udev_settle.py): `udevadm settle` first, udevd's queue marker where it
fails; its script run here with a stand-in `udevadm` on PATH."""

from __future__ import annotations

import os
import subprocess

import pytest

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.udev_settle import wait_udev_settled


class _LocalNode:
    def __init__(self, bin_dir):
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def shell(self, script, timeout_s=30):
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=self.env,
                              timeout=timeout_s)
        done.exit_code = done.returncode
        return done


def _node(tmp_path, udevadm_exit: int):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    udevadm = bin_dir / "udevadm"
    udevadm.write_text(f"#!/bin/sh\necho 'Failed to wait for daemon to reply' >&2\nexit {udevadm_exit}\n")
    udevadm.chmod(0o755)
    return _LocalNode(bin_dir)


def test_a_settle_that_succeeds_is_all(tmp_path, capsys):
    wait_udev_settled(_node(tmp_path, 0), 5, marker=str(tmp_path / "queue"))
    assert capsys.readouterr().out == ""


def test_a_failed_settle_with_an_empty_queue_passes_and_says_what_settle_said(tmp_path, capsys):
    wait_udev_settled(_node(tmp_path, 1), 5, marker=str(tmp_path / "queue"))
    out = capsys.readouterr().out
    assert "udevadm settle exited 1" in out and "Failed to wait for daemon to reply" in out


def test_a_failed_settle_with_a_queue_that_stays_is_an_infrastructure_error(tmp_path):
    marker = tmp_path / "queue"
    marker.touch()
    with pytest.raises(InfrastructureError, match="did not empty within 1 s.*Failed to wait"):
        wait_udev_settled(_node(tmp_path, 1), 1, marker=str(marker))
