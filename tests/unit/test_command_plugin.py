"""--device-plugin and --device-plugin-resource, checked before any VM starts (fixtures/command_plugin.py)."""

from __future__ import annotations

import os

import pytest

from hilconform.fixtures.command_plugin import (
    PluginCommandError,
    copy_unchanged,
    plugin_command,
    plugin_resources,
)
from hilconform.fixtures.errors import InfrastructureError

SCRIPT = b"#!/bin/sh\nexit 0\n"
SCRIPT_SHA256 = "306c6ca7407560340797866e077e053627ad409277d1b9da58106fce4cf717cb"  # sha256sum's


def _file(tmp_path, name, content: bytes, mode=0o755):
    path = tmp_path / name
    path.write_bytes(content)
    os.chmod(path, mode)
    return path


def _elf(machine: int) -> bytes:
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5] = 2, 1  # 64-bit, little-endian
    header[18:20] = machine.to_bytes(2, "little")
    return bytes(header)


def test_a_script_with_its_arguments_is_accepted(tmp_path):
    script = _file(tmp_path, "plugin.py", b"#!/usr/bin/env python3\nprint('hi')\n")
    command = plugin_command(f"{script} --resource example.com/gpu 'two words'")
    assert command.path == script.resolve()
    assert command.args == ("--resource", "example.com/gpu", "two words")
    assert len(command.sha256) == 64


def test_the_command_keeps_its_text_as_given_and_the_sha256_of_the_file_it_names(tmp_path, monkeypatch):
    _file(tmp_path, "plugin.sh", SCRIPT)
    monkeypatch.chdir(tmp_path)
    given = "./plugin.sh  --verbose"
    command = plugin_command(given)
    assert (command.given, command.sha256) == (given, SCRIPT_SHA256)
    assert command.path == tmp_path.resolve() / "plugin.sh"


def test_a_plugin_changed_since_its_check_is_not_started(tmp_path):
    """The certificate names the SHA-256 taken when the option was checked: a different file must
    not run under that name (the run breaks instead)."""
    script = _file(tmp_path, "plugin.sh", SCRIPT)
    command = plugin_command(str(script))
    script.write_bytes(SCRIPT + b"# changed\n")
    share = tmp_path / "share"
    with pytest.raises(InfrastructureError, match=f"changed since the run started.*{SCRIPT_SHA256}"):
        copy_unchanged(command.path, command.sha256, share)


def test_an_x86_64_elf_is_accepted(tmp_path):
    assert plugin_command(str(_file(tmp_path, "plugin", _elf(62)))).args == ()


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, "not a regular file"),
    (lambda p: _file(p, "x", b"#!/bin/sh\n", mode=0o644), "not executable"),
    (lambda p: _file(p, "arm", _elf(183)), "another machine"),
    (lambda p: _file(p, "data", b"just bytes\n"), "neither an ELF"),
])
def test_a_plugin_that_cannot_run_is_refused_naming_why(tmp_path, make, message):
    with pytest.raises(PluginCommandError, match=message):
        plugin_command(str(make(tmp_path)))


def test_an_empty_or_unbalanced_command_is_refused():
    with pytest.raises(PluginCommandError, match="empty"):
        plugin_command("  ")
    with pytest.raises(PluginCommandError, match="--device-plugin"):
        plugin_command("'unbalanced")


def test_resources_name_their_device_ids():
    (gpu,) = plugin_resources(["example.com/gpu=10DE:20b0,10de:20b2"])
    assert gpu.name == "example.com/gpu" and gpu.device_ids == {"10de:20b0", "10de:20b2"}


@pytest.mark.parametrize("spec", ["gpu=10de:20b0", "example.com/gpu", "example.com/gpu=10de20b0", "a/b="])
def test_a_malformed_resource_is_refused(spec):
    with pytest.raises(PluginCommandError, match="DOMAIN/NAME=vvvv:dddd"):
        plugin_resources([spec])
