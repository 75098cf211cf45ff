"""The one TOML writer: what it writes reads back as the same tables, and it refuses what it
cannot write instead of writing something else."""

from __future__ import annotations

import tomllib

import pytest

from hilconform.emulators.profile import available_profiles, load_profile
from hilconform.emulators.runtime_config import runtime_config_for, runtime_config_table
from hilconform.emulators.toml_writer import dump_toml, merge_tables


def test_nested_tables_quoted_keys_and_lists_read_back_unchanged():
    data = {"name": "x", "n": 3, "w": 1e12, "on": False, "ids": ["10de:20b0"],
            "aer": {"fault_weight": 4.0, "limits": {"a b": [1, 2]}}, "empty": {}}
    assert tomllib.loads(dump_toml(data, "a header\nof two lines")) == data


@pytest.mark.parametrize("value", [None, {1, 2}, float("nan"), [{"a": 1}]])
def test_a_value_it_has_no_form_for_is_refused_naming_where(value):
    with pytest.raises(ValueError, match="aer.bad"):
        dump_toml({"aer": {"bad": value}})


@pytest.mark.parametrize("name", available_profiles())
def test_every_profiles_runtime_config_reads_back_as_its_table(name):
    profile = load_profile(name)
    assert tomllib.loads(runtime_config_for(profile)) == runtime_config_table(profile)


def test_changes_merge_table_by_table_and_leave_the_rest():
    profile = load_profile("a100-stock")
    changes = {"aer": {"fault_weight": 4.0}, "firmware": {"1b36:0010": "9.9"}}
    changed = tomllib.loads(runtime_config_for(profile, {"lease_ttl_s": 2.0}, changes))
    plain = runtime_config_table(profile, {"lease_ttl_s": 2.0})
    assert changed["aer"] == {"fault_weight": 4.0} and changed["lease_ttl_s"] == 2.0
    assert changed["firmware"] == {**plain["firmware"], "1b36:0010": "9.9"}
    assert changed["hooks"] == plain["hooks"]
    assert merge_tables({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}
