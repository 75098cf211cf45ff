"""Host profiles: the shipped ones load, bad ones are named precisely."""

from __future__ import annotations

import pytest

from hilconform.emulators.errors import ProfileError
from hilconform.emulators.profile import PROFILE_DIR, available_profiles, load_profile

# Device-model hosts and their stock-device variants (nvme/edu stand-ins under their own names).
EXPECTED_SLOTS = {"a100": (2, 2), "t4": (2, 1), "fpga": (2, 1), "mixed": (2, 0),
                  "a100-stock": (4, 2), "t4-stock": (2, 1), "fpga-stock": (2, 1)}


@pytest.mark.parametrize("name", sorted(EXPECTED_SLOTS))
def test_shipped_profiles_have_the_promised_slots(name):
    profile = load_profile(name)
    populated = [s for s in profile.slots if s.populated]
    empty = [s for s in profile.slots if not s.populated]
    assert (len(populated), len(empty)) == EXPECTED_SLOTS[name]
    assert profile.hotplug_mode == "native"
    assert profile.budgets["drain_timeout_ms"] == 300
    for slot in profile.slots:
        assert slot.stands_in_for.vendor in {"10de", "10ee"}


def test_available_profiles_lists_all_shipped():
    assert set(EXPECTED_SLOTS) <= set(available_profiles())


def test_unknown_profile_lists_the_known_ones():
    known = r"\(known: a100, a100-stock, fpga, fpga-stock, mixed, t4, t4-stock\)"
    with pytest.raises(ProfileError, match=r"unknown host profile 'h900' " + known):
        load_profile("h900")


def _write(tmp_path, text: str):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


def _base() -> str:
    return (PROFILE_DIR / "t4-stock.toml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('speed = "8", width = "16" }\ndevice = "nvme"', 'speed = "9", width = "16" }\ndevice = "nvme"',
         "slots[0].link.speed"),
        ('device = "nvme"', 'device = "gpu9000"', "slots[0].device"),
        ('hotplug_mode = "native"', 'hotplug_mode = "magic"', "host.hotplug_mode"),
        ("memory_mib = 512", 'memory_mib = "lots"', "host.memory_mib"),
        ("chassis = 2", "chassis = 1", "slots[1].chassis"),
        ("lease_ttl_s = 5", 'lease_ttl_s = "soon"', "budgets.lease_ttl_s"),
        # typos are refused, never dropped or taken as something new (issue 14)
        ("[runtime]", "[runtme]", "runtme"),
        ("select_ids = [", "select_id = []\nselect_ids = [", "runtime.select_id"),
        ("memory_mib = 512", "memory_mb = 512", "host.memory_mb"),
        ("lease_ttl_s = 5", "lease_tll_s = 5", "budgets.lease_tll_s"),
        ('device = "nvme"', 'device = "nvme"\naccept = "nvme"', "slots[0].accept"),
        ('speed = "8", width = "16" }', 'speed = "8", widht = "16" }', "slots[0].link.widht"),
        ('model = "NVIDIA Tesla T4" }', 'model = "NVIDIA Tesla T4", vendro = "10de" }',
         "slots[0].stands_in_for.vendro"),
    ],
)
def test_malformed_profile_names_file_and_key(tmp_path, old, new, key):
    text = _base()
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value)
    assert repr(key) in str(info.value)


def test_missing_key_is_named(tmp_path):
    path = _write(tmp_path, _base().replace('name = "gpu0"\n', "", 1))
    with pytest.raises(ProfileError, match=r"'slots\[0\].name': missing"):
        load_profile(path)


def test_not_toml_is_named(tmp_path):
    path = _write(tmp_path, "[host\nname=")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(path)


def test_hotplug_mode_override():
    profile = load_profile("a100-stock").with_hotplug_mode("acpi")
    assert profile.hotplug_mode == "acpi"
    with pytest.raises(ProfileError):
        profile.with_hotplug_mode("pcmcia")


def test_a_misspelt_budget_names_the_one_it_resembles(tmp_path):
    path = _write(tmp_path, _base().replace("lease_ttl_s = 5", "lease_tll_s = 5", 1))
    with pytest.raises(ProfileError, match="did you mean 'lease_ttl_s'"):
        load_profile(path)
