"""`host_factory.profile` / `runtime_config()`: what the suites read before a VM starts.

Suites never load profiles themselves. A test that starts hosts of its own asks the
factory for the profile those hosts boot (to skip early, or to build a runtime
config); on a real host the factory skips, as `start()` does, so such a test skips
there instead of failing to load a profile named after an SSH target.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.fixtures.host_spec import parse_host_spec
from hilconform.fixtures.plugin import HostFactory

SUITES = Path(__file__).resolve().parents[2] / "suites"
REAL_SPEC = "real:ssh://root@lab-a100-07"


class Options:
    """The few command-line options HostFactory reads."""

    def __init__(self, **options):
        self.options = {f"--{k.replace('_', '-')}": v for k, v in options.items()}

    def getoption(self, name: str):
        return self.options.get(name)


class AskedForTheRealHost(Exception):
    """The test asked the factory for the real host itself (`fresh`): it runs there."""


class RealHostRequest:
    def getfixturevalue(self, name: str):
        assert name == "host"
        raise AskedForTheRealHost


def factory(spec: str, **options) -> HostFactory:
    return HostFactory(Options(**options), parse_host_spec(spec), request=RealHostRequest())


def test_the_profile_is_the_one_start_boots():
    assert factory("emulated:a100").profile == load_profile("a100")
    assert factory("emulated:a100", hotplug_mode="acpi").profile.hotplug_mode == "acpi"


def test_the_runtime_config_is_the_one_start_hands_the_guest():
    profile = load_profile("a100-stock")
    assert factory("emulated:a100-stock").runtime_config() == runtime_config_for(profile)
    changed = factory("emulated:a100-stock").runtime_config({"lease_ttl_s": 2.0})
    assert changed == runtime_config_for(profile, {"lease_ttl_s": 2.0})


@pytest.mark.parametrize("ask", [lambda f: f.profile, lambda f: f.runtime_config(), lambda f: f.start()])
def test_a_real_host_skips_instead_of_loading_a_profile(ask):
    with pytest.raises(pytest.skip.Exception, match="starts hosts of its own"):
        ask(factory(REAL_SPEC))


def hosts_of_their_own() -> list[tuple[Path, str]]:
    """Every suite test that takes `host_factory` and not `host` (it starts its hosts itself)."""
    found = []
    for path in sorted(SUITES.rglob("test_*.py")):
        source = path.read_text()
        for line in source.splitlines():
            if line.startswith("def test_") and "host_factory" in line:
                name = line[4:].split("(")[0]
                found.append((path, name))
    return found


def load_suite_module(path: Path, monkeypatch):
    """A suite's test module, imported as pytest would (its folder on sys.path)."""
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"suite_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("path", "name"),
    hosts_of_their_own(),
    ids=[f"{p.parent.name}/{p.stem}::{n}" for p, n in hosts_of_their_own()],
)
def test_a_suite_test_with_hosts_of_its_own_skips_on_a_real_host(path, name, monkeypatch):
    """The finding: on `--host real:ssh://...` these tests errored (ProfileError) before they skipped.
    A test that asks for a host in its starting state (`host_factory.fresh`: the DP suite) runs
    on the real host instead: it gets the `host` fixture, whose needs check skips where due."""
    test = getattr(load_suite_module(path, monkeypatch), name)
    parameters = inspect.signature(test).parameters
    if "host" in parameters:
        pytest.skip(f"{name} also takes the `host` fixture")
    arguments = {p: None for p in parameters} | {"host_factory": factory(REAL_SPEC)}
    with pytest.raises((pytest.skip.Exception, AskedForTheRealHost)):
        test(**arguments)


def test_a_fresh_host_on_a_real_host_is_the_real_host_put_back_after_the_test():
    class Real:
        def __init__(self):
            self.put_back_to = None

        def as_found(self):
            return 7

        def put_back(self, mark):
            self.put_back_to = mark

    real = Real()

    class Request:
        def getfixturevalue(self, name):
            assert name == "host"
            return real

    made = HostFactory(Options(), parse_host_spec(REAL_SPEC), request=Request())
    assert made.fresh(hotplug_mode="acpi") is real
    made.stop_all()
    assert real.put_back_to == 7


@pytest.mark.parametrize("asked", [{"runtime_config": "name = 'own'\n"}, {"allow_reboot": True},
                                   {"profile": "a100-stock"}, {"cold_boot": True}])
def test_a_fresh_host_a_real_host_cannot_be_is_skipped_naming_what_was_asked(asked):
    made = HostFactory(Options(), parse_host_spec(REAL_SPEC), request=RealHostRequest())
    with pytest.raises(pytest.skip.Exception, match=f"asks for a host of its own \\({next(iter(asked))}\\)"):
        made.fresh(**asked)
