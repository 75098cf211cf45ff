"""Which QEMU a host gets: the project's (>= 10.1, vfio-user) for every profile where it is set up;
a stock-device profile falls back to the system's."""

import pytest

from hilconform.emulators.errors import InfrastructureError, ProfileError, ToolMissing
from hilconform.emulators.layout import InstanceLayout
from hilconform.emulators.profile import PROFILE_DIR, load_profile
from hilconform.emulators.qemu_command import model_port_reserve, model_socket, stand_in_device
from hilconform.emulators.toolchain import qemu_binary, qemu_binary_for
from hilconform.emulators.vfio_user.model import load_model, window_reserve


def _fake_qemu(path, version: str, vfio_user: bool):
    """A qemu-system-x86_64 stand-in answering --version and `-device vfio-user-pci,help`."""
    help_text = "vfio-user-pci options:\n  socket=<SocketAddress>" if vfio_user else ""
    path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 'QEMU emulator version {version}' && exit 0\n"
                    f"[ -n \"{help_text}\" ] || exit 1\necho \"{help_text}\"\n")
    path.chmod(0o755)
    return str(path)


def test_stock_profiles_run_on_the_project_qemu_when_it_is_set_up(monkeypatch, tmp_path):
    new = _fake_qemu(tmp_path / "qemu-system-x86_64", "11.1.3", vfio_user=True)
    monkeypatch.setenv("HILCONFORM_QEMU_VFIO_USER", new)
    monkeypatch.delenv("HILCONFORM_QEMU_SYSTEM_X86_64", raising=False)
    profile = load_profile("a100-stock")
    assert not profile.uses_models
    assert qemu_binary_for(profile) == new


def test_stock_profiles_fall_back_to_the_system_qemu_without_one(monkeypatch, tmp_path):
    old = _fake_qemu(tmp_path / "qemu-system-x86_64", "7.2.22", vfio_user=False)
    monkeypatch.setenv("HILCONFORM_QEMU_VFIO_USER", old)
    monkeypatch.delenv("HILCONFORM_QEMU_SYSTEM_X86_64", raising=False)
    assert qemu_binary_for(load_profile("a100-stock")) == qemu_binary()


def test_a_named_system_qemu_is_what_stock_profiles_get(monkeypatch, tmp_path):
    new = _fake_qemu(tmp_path / "new", "11.1.3", vfio_user=True)
    named = _fake_qemu(tmp_path / "named", "7.2.22", vfio_user=False)
    monkeypatch.setenv("HILCONFORM_QEMU_VFIO_USER", new)
    monkeypatch.setenv("HILCONFORM_QEMU_SYSTEM_X86_64", named)
    assert qemu_binary_for(load_profile("a100-stock")) == named
    assert qemu_binary_for(load_profile("a100")) == new


def test_model_profiles_know_they_need_models():
    profile = load_profile("a100")
    assert profile.uses_models
    kind = profile.kind("model:a100-sxm4")
    assert (kind.qemu_driver, kind.vendor, kind.device, kind.class_code, kind.model) == (
        "vfio-user-pci", "10de", "20b0", "0302", "a100-sxm4")


def test_a_qemu_without_vfio_user_is_refused_with_the_way_to_get_one(monkeypatch, tmp_path):
    old = tmp_path / "qemu-system-x86_64"  # a QEMU that predates vfio-user, as Debian 12 ships
    old.write_text("#!/bin/sh\necho 'QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18)'\n")
    old.chmod(0o755)
    monkeypatch.setenv("HILCONFORM_QEMU_VFIO_USER", str(old))
    with pytest.raises(ToolMissing) as err:
        qemu_binary_for(load_profile("a100"))
    message = str(err.value)
    assert ">= 10.1" in message and "make qemu-prefix" in message and "QEMU 7.2.22" in message


def test_an_unknown_model_in_a_profile_names_the_slot(tmp_path):
    text = (PROFILE_DIR / "a100.toml").read_text().replace('device = "model:a100-sxm4"',
                                                              'device = "model:h100"', 1)
    path = tmp_path / "bad-host.toml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert "'slots[0].device'" in str(err.value) and "unknown device model 'h100'" in str(err.value)


def test_a_model_slot_on_the_command_line_points_at_its_socket(tmp_path):
    profile = load_profile("a100")
    layout = InstanceLayout(tmp_path)
    props = stand_in_device(profile.slot("gpu0"), profile.kind("model:a100-sxm4"), "gpu0", layout)
    assert props["driver"] == "vfio-user-pci" and props["bus"] == "rp-gpu0"
    assert props["socket"] == {"type": "unix", "path": str(model_socket(layout, "gpu0"))}
    with pytest.raises(InfrastructureError, match="instance folder"):
        stand_in_device(profile.slot("gpu0"), profile.kind("model:a100-sxm4"), "gpu0")


def test_model_ports_reserve_windows_the_bars_fit_in():
    a100 = load_model("a100-sxm4")
    assert window_reserve(a100) == {"mem-reserve": 16 << 20, "pref64-reserve": 512 << 20}
    u250 = load_model("alveo-u250")
    assert window_reserve(u250) == {"mem-reserve": 64 << 20, "pref64-reserve": 256 << 20}
    profile = load_profile("a100")
    assert model_port_reserve(profile, profile.slot("spare0")) == window_reserve(a100)
    assert model_port_reserve(load_profile("a100-stock"), load_profile("a100-stock").slot("spare0")) == {}
