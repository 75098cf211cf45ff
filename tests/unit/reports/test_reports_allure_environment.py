"""Allure's Environment widget names what a run certified: host, versions, and the device plugin."""

from __future__ import annotations

from hilconform.reports.allure_files import write_environment

CERTIFICATE = {
    "run": {"id": "20261202-0600-emulated-a100"},
    "host": {"spec": "emulated:a100", "profile": "a100", "hotplug_mode": "native"},
    "verdict": "CONFORMANT",
    "versions": {"qemu": "11.1.3"},
}


def _environment(tmp_path, certificate: dict) -> dict[str, str]:
    write_environment(tmp_path, certificate)
    lines = (tmp_path / "environment.properties").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_a_run_without_a_device_plugin_names_none(tmp_path):
    values = _environment(tmp_path, {**CERTIFICATE, "device_plugin": None})
    assert values["host"] == "emulated\\:a100"
    assert not any(key.startswith("device_plugin") for key in values)


def test_the_device_plugin_certified_is_named_with_its_sha256(tmp_path):
    plugin = {"kind": "command", "command": "/opt/plugin --flag", "sha256": "ab" * 32}
    values = _environment(tmp_path, {**CERTIFICATE, "device_plugin": plugin})
    assert values["device_plugin"] == "/opt/plugin --flag"
    assert values["device_plugin.sha256"] == "ab" * 32


def test_the_reference_front_end_is_named_by_its_kind(tmp_path):
    plugin = {"kind": "reference-front-end", "command": None, "sha256": None}
    values = _environment(tmp_path, {**CERTIFICATE, "device_plugin": plugin})
    assert values["device_plugin"] == "reference-front-end"
    assert "device_plugin.sha256" not in values
