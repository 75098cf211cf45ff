"""Host profiles: the shipped ones load, bad ones are named precisely."""

from __future__ import annotations

import pytest

from hilconform.emulators import budgets as budgets_module
from hilconform.emulators.budgets import budget_sets
from hilconform.emulators.errors import ProfileError
from hilconform.emulators.profile import PROFILE_DIR, available_profiles, load_profile

# Device-model hosts and their stock-device variants (nvme/edu stand-ins under their own names).
EXPECTED_SLOTS = {"a100": (2, 2), "t4": (2, 1), "fpga": (2, 1), "mixed": (2, 0),
                  "a100-stock": (4, 2), "t4-stock": (2, 1), "fpga-stock": (2, 1),
                  "switch-stock": (4, 2), "wide-stock": (4, 16)}


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
    known = r"\(known: a100, a100-stock, fpga, fpga-stock, mixed, switch-stock, t4, t4-stock, wide-stock\)"
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
        ('base = "tcg"', 'base = "tcg"\nlease_ttl_s = "soon"', "budgets.lease_ttl_s"),
        ('base = "tcg"', 'base = "tgc"', "budgets.base"),
        ('base = "tcg"', "base = 3", "budgets.base"),
        # typos are refused, never dropped or taken as something new (issue 14)
        ("[runtime]", "[runtme]", "runtme"),
        ("select_ids = [", "select_id = []\nselect_ids = [", "runtime.select_id"),
        ("memory_mib = 512", "memory_mb = 512", "host.memory_mb"),
        ('base = "tcg"', 'base = "tcg"\nlease_tll_s = 5', "budgets.lease_tll_s"),
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
    path = _write(tmp_path, _base().replace('base = "tcg"', 'base = "tcg"\nlease_tll_s = 5', 1))
    with pytest.raises(ProfileError, match="did you mean 'lease_ttl_s'"):
        load_profile(path)


# -- budget sets (a profile names its base set and sets only what differs) ----------------------

def test_a_profile_takes_its_base_sets_figures_and_overrides_only_its_own():
    tcg = budget_sets()["tcg"]["budgets"]
    switch = load_profile("switch-stock").budgets
    assert switch["hot_add_discovery_p95_ms"] == 3000 != tcg["hot_add_discovery_p95_ms"]
    assert {k: v for k, v in switch.items() if k not in _SWITCH_OWN} == {
        k: v for k, v in tcg.items() if k not in _SWITCH_OWN}
    assert load_profile("a100").budgets == tcg


_SWITCH_OWN = {"hot_add_discovery_p95_ms", "hot_add_discovery_over_floor_p95_ms",
               "cold_discovery_over_floor_ms"}


def test_a_profile_naming_no_base_starts_from_the_emulated_default_set(tmp_path):
    path = _write(tmp_path, _base().replace('base = "tcg"', "lease_ttl_s = 7", 1))
    budgets = load_profile(path).budgets
    assert budgets["lease_ttl_s"] == 7 and budgets["drain_timeout_ms"] == budget_sets()["tcg"]["budgets"][
        "drain_timeout_ms"]


def test_an_unknown_base_set_names_the_known_ones(tmp_path):
    path = _write(tmp_path, _base().replace('base = "tcg"', 'base = "kvm"', 1))
    with pytest.raises(ProfileError, match=r"'kvm' is not a budget set \(known: real-host, tcg"):
        load_profile(path)


@pytest.mark.parametrize(("text", "problem"), [
    ('[sets.x]\nmeaning = "m"\n[sets.x.budgets]\nlease_tll_s = 5\n', "did you mean 'lease_ttl_s'"),
    ('[sets.x]\nmeaning = "m"\n[sets.x.budgets]\nlease_ttl_s = "5"\n', "must be a number"),
    ('[sets.x]\nmeaning = "m"\ncolour = 1\n[sets.x.budgets]\n', "unknown: colour"),
    ('[sets.x]\nmeaning = "m"\ndefault_for = "virtual"\n[sets.x.budgets]\n', "default_for"),
    ('[set.x]\n', "unknown key 'set'"),
])
def test_the_budget_sets_file_is_read_strictly(tmp_path, monkeypatch, text, problem):
    path = tmp_path / "budget_sets.toml"
    path.write_text(text)
    monkeypatch.setattr(budgets_module, "BUDGET_SETS_PATH", path)
    budget_sets.cache_clear()
    try:
        with pytest.raises(ProfileError, match=problem):
            budget_sets()
    finally:
        budget_sets.cache_clear()


# -- switches (issue 14, topologies) -------------------------------------------------------------

def test_switch_stock_has_two_root_port_slots_and_a_switch_of_four():
    profile = load_profile("switch-stock")
    assert [s.name for s in profile.switches] == ["sw0"]
    assert [s.name for s in profile.root_port_slots] == ["gpu2", "gpu3"]
    below = profile.slots_below("sw0")
    assert [(s.name, s.populated) for s in below] == [
        ("gpu0", True), ("gpu1", True), ("spare0", False), ("spare1", False)]
    assert all(s.behind_switch and s.link_speed is None for s in below)
    assert {s.accepts for s in below} == {"nvme"}
    assert profile.root_ports == 3  # two slots and the switch's own root port
    assert profile.ports_above("spare0") == ("rp-spare0", "up-sw0", "rp-sw-sw0")
    assert profile.ports_above("gpu2") == ("rp-gpu2",)
    assert profile.root_port_id("gpu0") == "rp-sw-sw0"
    assert profile.switch("sw0").link_speed == "16"
    with pytest.raises(ProfileError, match="no switch 'sw9'"):
        profile.switch("sw9")


def test_switches_survive_a_hotplug_mode_override():
    profile = load_profile("switch-stock").with_hotplug_mode("acpi")
    assert [s.name for s in profile.switches] == ["sw0"]


def test_wide_stock_has_twenty_root_port_slots():
    profile = load_profile("wide-stock")
    assert len(profile.slots) == profile.root_ports == 20
    assert not profile.switches


def _switch_base() -> str:
    return (PROFILE_DIR / "switch-stock.toml").read_text()


_SWITCH = '[[switches]]\nname = "sw0"\nchassis = 10\nslot = 10\nlink = { speed = "16", width = "16" }\n'
_GPU0 = '[[slots]]\nname = "gpu0"\nswitch = "sw0"\nchassis = 11\nslot = 11\n'


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        # strict: unknown keys of a switch, and of a slot, are refused
        ('name = "sw0"\nchassis = 10', 'name = "sw0"\nchasis = 10\nchassis = 10', "switches[0].chasis"),
        (_GPU0, _GPU0.replace("switch =", "swtich ="), "slots[0].swtich"),
        # a slot names a switch the profile lacks
        (_GPU0, _GPU0.replace('"sw0"', '"sw9"'), "slots[0].switch"),
        # a switch nothing is behind
        (_SWITCH, _SWITCH + _SWITCH.replace("sw0", "sw1").replace("10", "20"), "switches[1].name"),
        (_SWITCH, _SWITCH + _SWITCH, "switches[1].name"),  # two switches of one name
        # chassis/slot numbers unique across root ports, downstream ports and switches' root ports
        (_GPU0, _GPU0.replace("chassis = 11", "chassis = 1"), "slots[4].chassis"),
        (_GPU0, _GPU0.replace("slot = 11", "slot = 2"), "slots[5].slot"),
        (_GPU0, _GPU0.replace("chassis = 11", "chassis = 10"), "slots[0].chassis"),
        (_GPU0, _GPU0.replace("slot = 11", "slot = 10"), "slots[0].slot"),
        (_SWITCH, _SWITCH.replace("chassis = 10", "chassis = 0"), "switches[0].chassis"),
        # a downstream port has no link caps of its own (QEMU's xio3130-downstream has no x-speed/x-width)
        (_GPU0, _GPU0 + 'link = { speed = "16", width = "16" }\n', "slots[0].link"),
        (_SWITCH, _SWITCH.replace('speed = "16"', 'speed = "9"'), "switches[0].link.speed"),
        (_SWITCH, _SWITCH.replace("link = ", "lnk = "), "switches[0].lnk"),
        # QEMU ids: slot 'sw-sw0' would have port id rp-sw-sw0, the switch's root port
        ('name = "gpu3"', 'name = "sw-sw0"', "slots[5].name"),
        # a model's BARs need window reserves a downstream port cannot take
        ('name = "spare0"\nswitch = "sw0"\nchassis = 13\nslot = 13\ndevice = "empty"\naccepts = "nvme"',
         'name = "spare0"\nswitch = "sw0"\nchassis = 13\nslot = 13\ndevice = "empty"\n'
         'accepts = "model:a100-sxm4"', "slots[2].switch"),
    ],
)
def test_malformed_switch_profile_names_file_and_key(tmp_path, old, new, key):
    text = _switch_base()
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value)
    assert repr(key) in str(info.value)


def _slots_toml(names, switch: str | None = None, first: int = 1) -> str:
    line = f'switch = "{switch}"\n' if switch else 'link = { speed = "16", width = "16" }\n'
    return "".join(
        f'[[slots]]\nname = "{name}"\nchassis = {(first + i) % 255 + 1}\nslot = {first + i}\n{line}'
        'device = "empty"\naccepts = "nvme"\n'
        'stands_in_for = { vendor = "10de", device = "20b0", model = "A100" }\n'
        for i, name in enumerate(names))


_HEAD = '[host]\nname = "t"\n[budgets]\nguest_ready_s = 90\n'


def test_at_most_32_slots_behind_a_switch(tmp_path):
    text = _HEAD + _SWITCH.replace("chassis = 10", "chassis = 255").replace("slot = 10", "slot = 999")
    path = _write(tmp_path, text + _slots_toml([f"d{i}" for i in range(33)], "sw0"))
    with pytest.raises(ProfileError, match=r"'switches\[0\].name': 33 slots behind switch 'sw0': at most 32"):
        load_profile(path)


def test_a_switch_takes_one_of_the_120_root_ports(tmp_path):
    switch = _SWITCH.replace("chassis = 10", "chassis = 255").replace("slot = 10", "slot = 999")
    text = _HEAD + switch + _slots_toml([f"r{i}" for i in range(120)]) + _slots_toml(["d0"], "sw0", 500)
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError, match="121 root ports .* at most 120 root ports"):
        load_profile(path)


def test_the_pci_buses_must_fit(tmp_path):
    # 10 switches of 24 slots: 250 ports with distinct chassis numbers, but 261 buses
    # (pcie.0, 10 root ports, 10 switch-internal buses, 240 below the downstream ports).
    switches = "".join(
        _SWITCH.replace("sw0", f"sw{k}").replace("chassis = 10", f"chassis = {241 + k}")
        .replace("slot = 10", f"slot = {1000 + k}") for k in range(10))
    slots = "".join(_slots_toml([f"d{k}-{i}" for i in range(24)], f"sw{k}", 24 * k) for k in range(10))
    path = _write(tmp_path, _HEAD + switches + slots)
    with pytest.raises(ProfileError, match=r"'switches': 261 PCI buses .* at most 256"):
        load_profile(path)
