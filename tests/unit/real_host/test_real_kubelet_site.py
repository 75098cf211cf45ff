"""The kubelet stand-in's place on a real host (fixtures/real_kubelet_site.py), on this machine.

`real:local` is this machine: the site is deployed with a LocalRunner, so what is checked here
is what a lab host gets, less the private mount namespace (that needs root and is shown by the
integration test against the emulated guest as a real host).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile

import pytest

from hilconform.fixtures.real_kubelet_site import RealKubeletSite, standard_path_and_parents
from hilconform.fixtures.remote_command import LocalRunner
from hilconform.fixtures.runtime_deployment import STAND_IN_PACKAGE, source_tarball


def test_the_mount_point_and_its_parents_outermost_first():
    assert standard_path_and_parents("/var/lib/kubelet/device-plugins") == [
        "/var", "/var/lib", "/var/lib/kubelet", "/var/lib/kubelet/device-plugins"]


def test_the_stand_in_ships_with_the_device_plugin_api_and_nothing_of_the_emulators():
    names = tarfile.open(fileobj=io.BytesIO(source_tarball(STAND_IN_PACKAGE))).getnames()
    assert "hilconform/emulators/kubelet_stand_in/__main__.py" in names
    assert "hilconform/runtime/deviceplugin/grpc_api.py" in names
    assert "hilconform/emulators/__init__.py" in names
    assert not [n for n in names if n.startswith("hilconform/emulators/") and "kubelet_stand_in" not in n
                and n != "hilconform/emulators/__init__.py"]


def test_the_watchdog_never_matches_its_own_command_line():
    site = RealKubeletSite(runner=None)
    site.folder = "/tmp/hilconform-kubelet.AbC123"
    script = site._watchdog()
    pattern = "/tmp/hilconform-kubelet.AbC123/"
    assert pattern not in script  # pkill -f would end the watchdog itself
    found = subprocess.run(["grep", "-c", "[/]tmp/hilconform-kubelet.AbC123/"], input=script,
                           capture_output=True, text=True)
    assert found.stdout.strip() == "0"


@pytest.fixture
def deployed(monkeypatch):
    """A site on this machine whose standard path is a folder of the test's own (not /var/lib)."""
    runner = LocalRunner()
    site = RealKubeletSite(runner)
    try:
        yield site, runner
    finally:
        site.remove()
        runner.close()


def test_a_copy_that_is_not_the_certified_file_is_refused(deployed, tmp_path):
    site, _runner = deployed
    site.folder = subprocess.run(["mktemp", "-d", "/tmp/hilconform-kubelet.XXXXXX"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    subprocess.run(["mkdir", f"{site.folder}/bin"], check=True)
    plugin = tmp_path / "plugin"
    plugin.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(Exception, match="not started"):
        site.install(plugin, "plugin", "0" * 64)
    path = site.install(plugin, "plugin", hashlib.sha256(b"#!/bin/sh\n").hexdigest())
    assert path == f"{site.folder}/bin/plugin"
    folder = site.folder
    site.remove()
    assert subprocess.run(["test", "-e", folder]).returncode == 1
