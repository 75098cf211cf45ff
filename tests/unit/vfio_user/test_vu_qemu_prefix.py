"""The QEMU prefix recipe: apt kept in its own folder, the wrapper, the stamp (no network needed)."""

import importlib.util
import subprocess
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
