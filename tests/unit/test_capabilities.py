"""The capability vocabulary is read strictly, and every name hosts declare or suites request is in it.

One vocabulary for both host kinds is only worth having if a word outside it
cannot slip in: a typo in a marker would skip a test forever, a typo in a host
would hide a capability it has.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hilconform.emulators.faults import ALL_CAPABILITIES
from hilconform.emulators.profile import HOTPLUG_MODES, available_profiles, load_profile
from hilconform.fixtures.capabilities import (
    VOCABULARY_FILE,
    CapabilityError,
    known,
    parse_vocabulary,
    vocabulary,
)
from hilconform.fixtures.host import emulated_capabilities
from hilconform.fixtures.host_protocol import CAPABILITY_PROTOCOLS
from hilconform.fixtures.real_host import SURVEYED_CAPABILITIES, real_capabilities

SUITES = Path(__file__).resolve().parents[2] / "suites"
GOOD = {"meaning": "a device can be reset", "destructive": True}


def test_the_vocabulary_file_reads_and_names_only_known_protocols():
    table = vocabulary()
    assert {"aer-nonfatal", "aer-fatal", "hot-add", "surprise-removal", "qmp", "real-host"} <= table.keys()
    assert {c.protocol for c in table.values()} - {None} <= CAPABILITY_PROTOCOLS.keys()
    assert table["qmp"].destructive is False and table["aer-fatal"].destructive is True


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ({**GOOD, "destrucitve": False}, "unknown key 'destrucitve'"),
        ({"meaning": "x"}, "lacks 'destructive'"),
        ({"destructive": True}, "lacks 'meaning'"),
        ({**GOOD, "destructive": "yes"}, "destructive must be a bool"),
        ({**GOOD, "protocol": "Teleport"}, "names protocol 'Teleport'"),
        ("reset a device", "'reset' is not a table"),
    ],
)
def test_a_malformed_entry_is_an_error_naming_it(entry, complaint):
    with pytest.raises(CapabilityError, match=complaint) as raised:
        parse_vocabulary({"reset": entry}, "capabilities.toml", CAPABILITY_PROTOCOLS)
    assert "reset" in str(raised.value)


def test_an_unknown_name_is_an_error_naming_it():
    assert known(["aer-fatal"], "here") == {"aer-fatal"}
    with pytest.raises(CapabilityError, match=r"here: unknown capability 'aer-inject' \(not in capabilities"):
        known(["aer-fatal", "aer-inject"], "here")


@pytest.mark.parametrize("name", available_profiles())
def test_emulated_hosts_declare_only_vocabulary_names(name):
    for mode in HOTPLUG_MODES:
        profile = load_profile(name).with_hotplug_mode(mode)
        for allow_reboot in (False, True):
            caps = emulated_capabilities(profile, allow_reboot)  # raises on an unknown name
            assert "qmp" in caps and ("reboot" in caps) == allow_reboot
            assert ("orderly-removal" in caps) == (mode == "native")
            assert ("surprise-removal" in caps) == (mode == "acpi")


def test_the_fault_injector_names_only_vocabulary_names():
    known(ALL_CAPABILITIES, "emulators/faults")


def test_real_hosts_declare_only_vocabulary_names():
    everything = real_capabilities(dict.fromkeys(SURVEYED_CAPABILITIES, True))
    assert {"real-host", "aer-nonfatal", "aer-fatal", "surprise-removal", "hot-add", "reset"} <= everything
    assert not {"qmp", "reboot", "orderly-removal", "config-loss"} & everything
    assert real_capabilities({}) == {"real-host"}
    assert real_capabilities({"aer-inject": True, "aer-inject-loaded": True}) == {
        "real-host",
        "aer-nonfatal",
        "aer-fatal",
    }


def suite_markers() -> list[tuple[str, str]]:
    """(where, capability) for every argument of a `needs` marker in the suites."""
    found = []
    for path in sorted(SUITES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "needs"
                and ast.unparse(node.func.value) == "pytest.mark"
            ):
                for arg in node.args:
                    assert isinstance(arg, ast.Constant), f"{path}:{node.lineno}: needs() takes names"
                    found.append((f"{path.relative_to(SUITES)}:{node.lineno}", arg.value))
    return found


def test_every_capability_the_suites_need_is_in_the_vocabulary():
    markers = suite_markers()
    assert len(markers) > 20, "the suites' needs markers were not found"
    unknown = [f"{where}: {name!r}" for where, name in markers if name not in vocabulary()]
    assert not unknown, f"not in {VOCABULARY_FILE.name}: {unknown}"
