"""The QEMU prefix recipe: apt kept in its own folder, the wrapper, the stamp (no network needed)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "vm-images" / "build_qemu_prefix.py"


@pytest.fixture(scope="module")
def recipe_module():
    spec = importlib.util.spec_from_file_location("build_qemu_prefix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_apt_state_lives_in_its_own_folder(recipe_module):
    argv = recipe_module.apt_argv(recipe_module.recipe())
    options = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    dirs = {k: v for k, v in options.items() if k.startswith("Dir::")}
    assert {"Dir::Etc::SourceList", "Dir::State::Lists", "Dir::State::status", "Dir::Cache"} <= set(dirs)
    for key, value in dirs.items():
        assert Path(value).is_relative_to(recipe_module.APT_DIR), key  # nothing of the system's apt
    assert options["APT::Get::Download-Only"] == "true"


def test_recipe_names_a_vfio_user_qemu(recipe_module):
    cfg = recipe_module.recipe()
    assert recipe_module.version_tuple(cfg["min_version"]) >= (10, 1)
    assert "qemu-system-x86" in cfg["packages"] and cfg["release"] == "trixie-backports"


def test_wrapper_uses_the_prefix_loader_firmware_and_modules(recipe_module):
    text = recipe_module.WRAPPER_TEXT
    assert "ld-linux-x86-64.so.2" in text and "--library-path" in text
    assert '-L "$P/usr/share/qemu" -L "$P/usr/share/seabios"' in text and "QEMU_MODULE_DIR" in text
    assert 'exec ' in text and '"$@"' in text  # the PID stays QEMU's


def test_check_reports_without_building():
    result = subprocess.run(["python3", str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1) and not result.stdout.strip()


# -- the Debian 13 path (proved in a trixie chroot: docs/device-models.md, "Debian 13") ------------
@pytest.mark.parametrize("text, major", [("13.8\n", 13), ("12.11\n", 12), ("forky/sid\n", 0)])
def test_debian_major_reads_the_release_number(recipe_module, tmp_path, text, major):
    version_file = tmp_path / "debian_version"
    version_file.write_text(text)
    assert recipe_module.debian_major(version_file) == major
    assert recipe_module.debian_major(tmp_path / "absent") == 0  # not Debian


@pytest.mark.parametrize("system, major, way", [
    (None, 13, "backports"), (None, 14, "backports"), (None, 12, "prefix"), (None, 0, "prefix"),
    ("11.1.3", 13, "system"), ("11.1.3", 12, "system"),
])
def test_debian_13_installs_from_backports_and_debian_12_builds_the_prefix(recipe_module, system, major, way):
    assert recipe_module.way_to_get_qemu(system, major) == way


def test_backports_sources_enable_the_release_signed_by_the_archive_key(recipe_module):
    cfg = recipe_module.recipe()
    text = recipe_module.backports_sources(cfg, "http://mirror.example/debian")
    fields = dict(line.split(": ", 1) for line in text.splitlines())
    assert fields == {"Types": "deb", "URIs": "http://mirror.example/debian", "Suites": "trixie-backports",
                      "Components": "main", "Signed-By": recipe_module.KEYRING}
    assert cfg["trixie_backports_sources"].startswith("/etc/apt/sources.list.d/")
    assert cfg["trixie_backports_sources"].endswith(".sources")  # deb822, as written


def test_backports_install_takes_depends_only_from_the_release(recipe_module):
    cfg = recipe_module.recipe()
    argv = recipe_module.backports_install_argv(cfg)
    assert argv[:3] == ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"] and "install" in argv
    assert "-y" in argv and "--no-install-recommends" in argv  # Recommends: GUI, GL, spice (~1.1 GB)
    assert argv[argv.index("-t") + 1] == "trixie-backports"
    assert argv[-len(cfg["packages"]):] == cfg["packages"]


def fake_qemu(folder: Path, version: str, vfio_user: bool) -> Path:
    """A stand-in qemu-system-x86_64 that prints a version and maybe the vfio-user-pci options."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "qemu-system-x86_64"
    device = 'echo "vfio-user-pci options:"; echo "  socket=<SocketAddress>"; exit 0' if vfio_user \
        else 'echo "\'vfio-user-pci\' is not a valid device model name" >&2; exit 1'
    binary.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "QEMU emulator version {version}"; '
                      f'exit 0; fi\n{device}\n')
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("version, vfio_user, found", [
    ("11.1.3 (Debian 1:11.1.3+ds-1~bpo13+1)", True, "11.1.3"),
    ("11.1.3", False, None),      # new enough, but built without the client device
    ("10.0.7", False, None),      # Debian 13's own
    ("7.2.19", False, None),      # Debian 12's own
])
def test_system_qemu_counts_only_with_the_vfio_user_client(recipe_module, tmp_path, monkeypatch,
                                                           version, vfio_user, found):
    fake_qemu(tmp_path / "bin", version, vfio_user)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert recipe_module.system_qemu_new_enough("10.1") == found


def test_a_new_enough_system_qemu_needs_no_stamp(recipe_module, tmp_path, monkeypatch):
    """Else a user on Debian 13 (QEMU from backports, no stamp or an old one) is told to run it as root."""
    monkeypatch.setattr(recipe_module, "STAMP", tmp_path / "absent.stamp")
    monkeypatch.setattr(recipe_module, "WRAPPER", tmp_path / "absent-wrapper")
    fake_qemu(tmp_path / "bin", "11.1.3", vfio_user=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert recipe_module.up_to_date()
    fake_qemu(tmp_path / "bin", "10.0.7", vfio_user=False)
    assert not recipe_module.up_to_date()  # no stamp, no prefix, system too old: build needed


def test_incomplete_standard_library_is_named_not_a_traceback():
    """Debian's python3-minimal alone (a minbase chroot) lacks shutil and tomllib."""
    code = ("import runpy, sys; sys.modules['tomllib'] = None; sys.argv = ['x', '--check']; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "standard library is incomplete" in result.stderr and "apt-get install python3" in result.stderr
    assert "Traceback" not in result.stderr


def test_backports_come_from_the_mirror_the_host_already_uses(recipe_module):
    policy = """Package files:
 100 /var/lib/dpkg/status
 100 http://deb.debian.org/debian trixie-backports/main amd64 Packages
 500 http://security.debian.org/debian-security trixie-security/main amd64 Packages
 500 http://mirror.lab.example/debian trixie/main amd64 Packages
"""
    assert recipe_module.mirror_in_policy(policy) == "http://mirror.lab.example/debian"
    assert recipe_module.mirror_in_policy(" 100 /var/lib/dpkg/status\n") is None  # then deb.debian.org
