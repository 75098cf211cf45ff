"""Bad set-up gets a clear message: missing image, missing QEMU, stale folders, bad --host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from hilconform.emulators import instance_dir
from hilconform.emulators.errors import ImageMissing, ToolMissing
from hilconform.emulators.image import GuestImage
from hilconform.emulators.toolchain import find_tool
from hilconform.fixtures.host_spec import HostSpecError, parse_host_spec


def test_missing_image_says_how_to_build_it(tmp_path):
    with pytest.raises(ImageMissing, match=r"make image"):
        GuestImage.locate(tmp_path)


def test_missing_qemu_says_how_to_install_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolMissing, match="apt-get install qemu-system-x86"):
        find_tool("qemu-system-x86_64")


def test_tool_override_must_exist(monkeypatch):
    monkeypatch.setenv("HILCONFORM_QEMU_NBD", "/nonexistent/qemu-nbd")
    with pytest.raises(ToolMissing, match="HILCONFORM_QEMU_NBD=/nonexistent/qemu-nbd"):
        find_tool("qemu-nbd")


def test_stale_instance_folder_is_removed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / "a100-stale"
    (stale / "pids").mkdir(parents=True)
    (stale / "owner.pid").write_text(f"{dead.pid}\n")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(stale / "qmp.sock"))  # a socket left behind by a crashed run
    sock.close()
    fresh = instance_dir.make_instance_dir("a100")
    assert not stale.exists()
    assert "removed stale instance folder" in capsys.readouterr().err
    assert fresh.exists() and len(str(fresh / "qmp.sock")) < 100


def test_live_instance_folder_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HILCONFORM_RUN_ROOT", str(tmp_path))
    live = tmp_path / "a100-live"
    live.mkdir()
    (live / "owner.pid").write_text(f"{os.getpid()}\n")
    instance_dir.make_instance_dir("a100")
    assert live.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a100", "expected KIND:NAME"),
        ("emulated:h900", "unknown emulated host 'h900'"),
        ("cloud:a100", "unknown host kind 'cloud'"),
    ],
)
def test_bad_host_spec(text, message):
    with pytest.raises(HostSpecError, match=message):
        parse_host_spec(text)


def test_bad_host_option_is_a_usage_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hilconform.fixtures.plugin", "--host",
         "emulated:h900", "--collect-only", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 4
    assert "unknown emulated host 'h900'" in result.stderr
