"""A plugin's container image on a real host (fixtures/real_kubelet_site.py), on this machine.

`real:local` is this machine: the stand-in's folder is made here, the image (this machine's own
`sleep` and the libraries it loads, in an OCI archive written by hand) is installed as a bundle
and run by the OCI runtime found here (crun, or runc where cgroups are hybrid: `make test`
installs both), and the
watchdog's end of the run must end the container and leave nothing: no container, no process,
no folder. What a plugin does in its container is the integration tests' (against the emulated
guest as a real host)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from test_oci_image import executable_image

from hilconform.fixtures.image_plugin import NodeBundle, plugin_image
from hilconform.fixtures.real_kubelet_site import RealKubeletSite
from hilconform.fixtures.remote_command import LocalRunner, put_tree

MARK = "31337"  # the container's `sleep` argument: its command line is found by it


def _sleeper_image(path: Path) -> Path:
    """An OCI archive whose one layer holds /usr/bin/sleep and the libraries `ldd` names."""
    return executable_image(path, "/usr/bin/sleep", {"Entrypoint": ["/usr/bin/sleep"], "Cmd": [MARK]})


@pytest.fixture
def site():
    """The stand-in's folder on this machine with its watchdog running (not `deploy`: that needs
    the system python3's grpc and makes /var/lib/kubelet here)."""
    runner = LocalRunner()
    site = RealKubeletSite(runner)
    site.folder = subprocess.run(["mktemp", "-d", "/tmp/hilconform-kubelet.XXXXXX"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    site._session = runner.spawn(site._watchdog(), runner.folder / "kubelet-site.log")
    try:
        yield site
    finally:
        site.remove()
        runner.close()


def _container_processes() -> str:
    return subprocess.run(["pgrep", "-a", "-f", f"^/usr/bin/sleep {MARK}$"], capture_output=True,
                          text=True).stdout


def test_the_image_runs_under_the_hosts_runtime_and_the_watchdog_ends_it(site, tmp_path):
    runtime, why = site.oci_runtime()  # crun, or runc where the cgroups are hybrid (crun refuses them)
    assert runtime in ("crun", "runc"), f"make test installs both: {why}"
    image = plugin_image(str(_sleeper_image(tmp_path / "sleeper.tar")))
    bundle = site.install_bundle(image, runtime)
    images, state = f"{site.folder}/images", f"{site.folder}/oci"
    assert bundle == NodeBundle(f"{images}/{image.image.digest[7:23]}", runtime, state)
    assert site.install_bundle(image, runtime) is bundle  # streamed once per deployment
    config = json.loads(Path(bundle.path, "config.json").read_text())
    assert config["process"]["args"] == ["/usr/bin/sleep", MARK]
    runner = site.runner
    run = bundle.command("run", "--bundle", bundle.path, "c1")
    log = f"{site.folder}/c1.log"
    started = runner.shell(f"mkdir -p {state}; setsid {run} > {log} 2>&1 < /dev/null & echo $!")
    assert started.exit_code == 0, started.stderr
    deadline = time.monotonic() + 20
    while not _container_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _container_processes(), f"{runtime} did not run the container: {Path(log).read_text()}"
    state = json.loads(runner.shell(bundle.command("state", "c1")).stdout)
    assert state["status"] == "running" and str(state["pid"]) in _container_processes()

    folder = site.folder
    site.remove()  # the watchdog: the container first, then the folder's processes, then the folder
    assert _container_processes() == ""
    assert not Path(folder).exists()
    assert subprocess.run(["pgrep", "-f", folder], capture_output=True).returncode == 1


def test_a_host_without_an_oci_runtime_says_which_it_looked_for(site, tmp_path):
    runner, tools = site.runner, tmp_path / "bin"
    tools.mkdir()
    (tools / "grep").symlink_to(subprocess.run(["sh", "-c", "command -v grep"], capture_output=True,
                                               text=True, check=True).stdout.strip())

    class NoRuntimes:  # this machine with only grep on the PATH
        def shell(self, script, timeout_s=30.0):
            return runner.shell(f"PATH={tools}; {script}", timeout_s=timeout_s)

    site.runner = NoRuntimes()
    try:
        assert site.oci_runtime() == (None, "no crun or runc to run it is installed")
    finally:
        site.runner = runner


def test_a_folder_is_copied_with_its_links_and_modes(tmp_path):
    local = tmp_path / "bundle"
    (local / "rootfs/bin").mkdir(parents=True)
    (local / "rootfs/bin/tool").write_bytes(b"x")
    (local / "rootfs/bin/tool").chmod(0o750)
    (local / "rootfs/link").symlink_to("bin/tool")
    runner = LocalRunner()
    try:
        put_tree(runner, local, str(tmp_path / "there/b"))
    finally:
        runner.close()
    copied = tmp_path / "there/b/rootfs"
    assert (copied / "bin/tool").read_bytes() == b"x"
    assert (copied / "bin/tool").stat().st_mode & 0o777 == 0o750
    assert (copied / "link").readlink() == Path("bin/tool")
    assert not (tmp_path / "bundle.tar").exists()  # the archive went away
