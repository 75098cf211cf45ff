"""Suites reach a host only through what it declares: `host.get(capability)`, never its insides.

A suite that reached `host.vm`, `host.faults` or QMP would run on one kind of host only and
would skip, or break, everywhere else; one that called a capability's method on the host
itself would bypass the check that the host declares it (docs/capabilities.md). Checked on
every suite file with `ast`, so the rule names the file and line that breaks it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hilconform.fixtures.host_protocol import CAPABILITY_PROTOCOLS, Host

SUITES = Path(__file__).resolve().parents[2] / "suites"
INSIDES = {"vm", "faults", "workload", "qmp"}  # a host's backend, never a suite's business
HOST_NAMES = {"host", "self.host", "rig.host"}  # how the suites name the host they test


def capability_methods() -> set[str]:
    """Every method a capability protocol offers, less those the core offers as well."""
    core = set(vars(Host)) | set(vars(Host).get("__annotations__", {}))
    methods = set()
    for protocol in CAPABILITY_PROTOCOLS.values():
        methods |= {n for n in vars(protocol) if not n.startswith("_")}
    return methods - core


def breaches(path: Path) -> list[str]:
    found = []
    methods = capability_methods()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        shown = path.relative_to(SUITES) if path.is_relative_to(SUITES) else path.name
        where = f"{shown}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in INSIDES:
            found.append(f"{where}: .{node.attr} (ask host.get(capability) instead)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if owner == "host_factory" and node.func.attr == "start":
                found.append(f"{where}: host_factory.start() (host_factory.fresh() works on every host)")
            if owner in HOST_NAMES and node.func.attr in methods:
                found.append(f"{where}: {owner}.{node.func.attr}() on the host itself "
                             f"(host.get(capability).{node.func.attr}())")
    return found


@pytest.mark.parametrize("path", sorted(SUITES.rglob("*.py")), ids=lambda p: str(p.relative_to(SUITES)))
def test_a_suite_reaches_a_host_only_through_its_capabilities(path):
    assert not breaches(path), "\n".join(breaches(path))


def test_the_rule_sees_each_kind_of_breach(tmp_path):
    sample = tmp_path / "test_breach_sample.py"
    sample.write_text("def test(host, host_factory):\n"
            "    host.vm.qmp.execute('device_add', {})\n"
            "    host.faults.stall_queue('gpu0')\n"
            "    host_factory.start()\n"
            "    host.hot_add('spare0')\n"
            "    host.get('hot-add').hot_add('spare0')\n")
    found = breaches(sample)
    assert len(found) == 5, found  # .vm, .qmp, .faults, start(), hot_add() on the host; not get()'s
