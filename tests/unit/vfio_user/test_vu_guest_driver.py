"""Guest drivers of device models: the model field, the run-share file, the emulated IOMMU and the
check after boot (a fake agent here; the real guest is tests/integration/test_model_guest_driver.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hilconform.emulators.errors import InfrastructureError
from hilconform.emulators.profile import available_profiles, load_profile
from hilconform.emulators.vfio_user import driver_table, guest_driver
from hilconform.emulators.vfio_user.model import MODEL_DIR, ModelError, load_model

SCRIPT = Path(__file__).resolve().parents[3] / "vm-images" / "guest-drivers.sh"


def _profile(models: bool):
    """A shipped host profile with (or without) device models, whatever the profiles are named."""
    for name in available_profiles():
        profile = load_profile(name)
        if profile.uses_models == models and (not models or any(
                profile.kind(s.device).model == "a100-sxm4" for s in profile.slots if s.populated)):
            return profile
    pytest.fail(f"no shipped profile {'with A100 models' if models else 'without models'}")


def test_shipped_models_name_vfio_pci():
    for name in ("a100-sxm4", "t4", "alveo-u250"):
        assert load_model(name).guest_driver == "vfio-pci"
    driver = driver_table.guest_drivers()["vfio-pci"]
    assert driver.needs_iommu and driver.modules[0] == ("vfio",)
    assert ("vfio-pci", "disable_idle_d3=1") in driver.modules


def test_unknown_guest_driver_is_refused_naming_file_and_field(tmp_path):
    text = (MODEL_DIR / "a100-sxm4.toml").read_text()
    assert 'guest_driver = "vfio-pci"' in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace('guest_driver = "vfio-pci"', 'guest_driver = "nvidia"'))
    with pytest.raises(ModelError) as err:
        load_model(path)
    assert str(path) in str(err.value) and "'guest_driver'" in str(err.value) and "vfio-pci" in str(err.value)


def test_a_model_without_guest_driver_loads_with_none(tmp_path):
    text = (MODEL_DIR / "t4.toml").read_text().replace('guest_driver = "vfio-pci"', "")
    path = tmp_path / "plain.toml"
    path.write_text(text)
    assert load_model(path).guest_driver is None


def test_share_file_loads_modules_then_binds_by_ids():
    text = guest_driver.share_text(_profile(models=True))
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines[:2] == ["module vfio", "module vfio-pci disable_idle_d3=1"]
    assert "bind 10de 20b0 vfio-pci" in lines
    assert all(ln.startswith(("module ", "bind ")) for ln in lines)


def test_stock_profile_gets_no_share_file_and_no_iommu():
    stock = _profile(models=False)
    assert guest_driver.share_text(stock) is None
    argv = ["qemu", "-append", "console=ttyS0", "-device", "{}"]
    assert guest_driver.with_iommu(argv, stock) == argv


def test_model_profile_gets_the_iommu_before_any_device_and_its_kernel_argument():
    argv = ["qemu", "-append", "console=ttyS0", "-drive", "x", "-device", '{"driver":"virtio-blk-pci"}']
    out = guest_driver.with_iommu(argv, _profile(models=True))
    assert out[out.index("-append") + 1] == "console=ttyS0 intel_iommu=on"
    first = out.index("-device")
    assert json.loads(out[first + 1])["driver"] == "intel-iommu"
    assert json.loads(out[first + 3])["driver"] == "virtio-blk-pci"
    assert argv[2] == "console=ttyS0", "the caller's argv must not change"
    with pytest.raises(InfrastructureError, match="-append"):
        guest_driver.with_iommu(["qemu", "-device", "{}"], _profile(models=True))


class _FakeAgent:
    def __init__(self, links: dict[str, str]):
        self.links = links

    def run(self, argv, timeout_s):
        path = argv[-1]
        bdf = path.split("/")[-2]
        if bdf in self.links:
            return SimpleNamespace(exit_code=0, stdout=f"../../../bus/pci/drivers/{self.links[bdf]}\n")
        return SimpleNamespace(exit_code=1, stdout="")


class _FakeQmp:
    def __init__(self, profile):
        self.profile = profile

    def execute(self, command, *args, **kwargs):
        assert command == "query-pci"
        devices = []
        for index, slot in enumerate(self.profile.slots):
            bus = index + 1
            below = [{"bus": bus, "slot": 0, "function": 0, "qdev_id": slot.name,
                      "id": {"vendor": 0x10DE, "device": 0x20B0},
                      "class_info": {"class": 0x0302}}] if slot.populated else []
            devices.append({"bus": 0, "slot": 16 + index, "function": 0, "qdev_id": slot.port_id,
                            "id": {"vendor": 0x1B36, "device": 0x000C}, "class_info": {"class": 0x0604},
                            "pci_bridge": {"bus": {"number": bus, "secondary": bus}, "devices": below}})
        return [{"bus": 0, "devices": devices}]


def _fake_vm(links):
    profile = _profile(models=True)
    return SimpleNamespace(profile=profile, agent=_FakeAgent(links), qmp=_FakeQmp(profile),
                           console_log=lambda: "hilconform-init: guest-drivers: vfio-pci did not bind\n")


def test_check_bound_names_the_unbound_model():
    vm = _fake_vm({})
    with pytest.raises(InfrastructureError, match=r"(?s)vfio-pci is not bound to slot \S+'s model a100-sxm4.*"
                                                  r"bound: None.*did not bind"):
        guest_driver.check_bound(vm)


def test_check_bound_passes_when_every_cold_plugged_model_has_its_driver():
    populated = [i for i, s in enumerate(_profile(models=True).slots) if s.populated]
    vm = _fake_vm({f"0000:{i + 1:02x}:00.0": "vfio-pci" for i in populated})
    assert set(guest_driver.check_bound(vm).values()) == {"vfio-pci"}
    wrong = _fake_vm({f"0000:{i + 1:02x}:00.0": "nouveau" for i in populated})
    with pytest.raises(InfrastructureError, match="bound: nouveau"):
        guest_driver.check_bound(wrong)


def test_guest_script_is_valid_posix_shell():
    result = subprocess.run(["sh", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
