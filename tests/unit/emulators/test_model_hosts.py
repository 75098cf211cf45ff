"""Hosts of device models: selectable by name, and the runtime config they hand the guest."""

from __future__ import annotations

import tomllib

import pytest

from hilconform.emulators.profile import available_profiles, load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.fixtures.host_spec import HostSpecError, parse_host_spec
from hilconform.runtime import config as runtime_config


@pytest.mark.parametrize("name", ["a100", "t4", "fpga", "mixed"])
def test_model_hosts_are_selectable_by_name(name):
    assert name in available_profiles()
    assert parse_host_spec(f"emulated:{name}").name == name
    profile = load_profile(name)
    assert profile.name == name and profile.uses_models


@pytest.mark.parametrize("name", ["a100-stock", "t4-stock", "fpga-stock"])
def test_stock_variants_stay_stock(name):
    assert not load_profile(name).uses_models
    with pytest.raises(HostSpecError, match="a100-stock"):  # listed among the known hosts
        parse_host_spec("emulated:a100-stok")


def test_a100_config_selects_the_model_ids(tmp_path):
    text = runtime_config_for(load_profile("a100"))
    table = tomllib.loads(text)
    assert table["selector"]["ids"] == ["10de:20b0"]
    assert table["hooks"]["models"] == ["10de:20b0"]
    assert "10de:20b0" not in table["hooks"]["firmware"]  # the register reports it, no override
    assert table["firmware"] == {"10de:20b0": "92.0.36"}  # the model file's version is expected
    path = tmp_path / "runtime.toml"
    path.write_text(text)
    cfg = runtime_config.load(str(path))  # the runtime accepts it
    assert cfg.hooks["models"] == ["10de:20b0"]


def test_mixed_host_config_expects_each_models_firmware():
    table = tomllib.loads(runtime_config_for(load_profile("mixed")))
    assert table["hooks"]["models"] == ["10de:1eb8", "10ee:5005"]
    assert table["firmware"] == {"10ee:5005": "2.3.0", "10de:1eb8": "90.4.38"}


def test_stock_host_config_has_no_models():
    table = tomllib.loads(runtime_config_for(load_profile("a100-stock")))
    assert "models" not in table["hooks"]
    assert table["hooks"]["firmware"] == {"1b36:0010": "1.0"}


def test_runtime_refuses_a_malformed_models_list(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[hooks]\nmodels = "10de:20b0"\n')
    with pytest.raises(runtime_config.ConfigError, match="hooks.models"):
        runtime_config.load(str(path))
