"""The `needs` marker, checked at setup by the plugin: a skip with the reason, never an error.

An inner pytest run (the plugin loaded, no VM, no real host: a small fake real host
replaces the real one, and an emulated host is judged from its profile before any VM
would start) shows the reasons a lab reads: the host and the capability it lacks,
or the flag a destructive capability needs on a real host.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from hilconform.fixtures.needs import unmet

FAKE_REAL_HOST = """
import pytest
import hilconform.fixtures.real_host_plugin as real_plugin


class FakeRealHost:
    name = "fake"
    allow_destructive = False
    description = "real:fake (profile a100, read-only)"
    capabilities = frozenset({"real-host", "aer-nonfatal", "aer-fatal"})

    def preflight(self):
        pass

    class runner:
        @staticmethod
        def close():
            pass


real_plugin.make_real_host = lambda config: FakeRealHost()


@pytest.fixture(scope="session")
def real_host():
    return FakeRealHost()
"""

TESTS = """
import pytest


@pytest.mark.needs("real-host")
def test_offered(host):
    assert "real-host" in host.capabilities


@pytest.mark.needs("qmp")
def test_missing(host):
    raise AssertionError("ran without the capability")


@pytest.mark.needs("aer-fatal")
def test_read_only(host):
    raise AssertionError("changed a read-only host")


@pytest.mark.needs("orderly-removal")
def test_factory(host_factory):
    host_factory.start(hotplug_mode="acpi")
    raise AssertionError("started a host without the capability")


@pytest.mark.needs("nvml")
def test_emulated_missing(host):
    raise AssertionError("ran without the capability")
"""


def inner_run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(FAKE_REAL_HOST)
    (tmp_path / "test_inner.py").write_text(TESTS)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "hilconform.fixtures.plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "--strict-markers",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


def skips(result: subprocess.CompletedProcess) -> dict[str, str]:
    """test name -> skip reason, from -rs's short summary."""
    out = {}
    for line in result.stdout.splitlines():
        if line.startswith("SKIPPED"):
            where, reason = line.split(": ", 1)[0], line.split(": ", 1)[1]
            out[where.rsplit(":", 1)[-1]] = reason
    return out


def test_on_a_real_host_a_missing_or_destructive_capability_skips_with_the_reason(tmp_path):
    result = inner_run(
        tmp_path, "--host", "real:local", "-k", "test_offered or test_missing or test_read_only"
    )
    reasons = list(skips(result).values())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 2 skipped" in result.stdout, result.stdout
    assert any("host real:fake (profile a100, read-only) lacks capability 'qmp'" in r for r in reasons), (
        reasons
    )
    assert any("'aer-fatal' changes host real:fake" in r and "--allow-destructive" in r for r in reasons), (
        reasons
    )


def test_on_an_emulated_host_the_profile_decides_before_any_vm_starts(tmp_path):
    result = inner_run(tmp_path, "--host", "emulated:a100-stock", "-k", "factory or emulated_missing")
    reasons = list(skips(result).values())
    assert result.returncode == 0 and "2 skipped" in result.stdout, result.stdout + result.stderr
    assert any("host emulated:a100-stock (native hot-plug) lacks capability 'nvml'" in r for r in reasons), (
        reasons
    )
    assert any(
        "host emulated:a100-stock (acpi hot-plug) lacks capability 'orderly-removal'" in r for r in reasons
    ), reasons


def test_a_marker_naming_an_unknown_capability_is_a_usage_error(tmp_path):
    (tmp_path / "test_typo.py").write_text(
        "import pytest\n@pytest.mark.needs('aer-inject')\ndef test_x(host):\n    pass\n"
    )
    result = inner_run(tmp_path, "--host", "emulated:a100", "--collect-only")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "unknown capability 'aer-inject'" in result.stderr


@pytest.mark.parametrize(
    ("needed", "offered", "allow", "reason"),
    [
        (("aer-fatal",), {"aer-fatal"}, True, None),
        (("qmp", "reboot"), {"qmp"}, True, "host h lacks capability 'reboot'"),
        (("real-host",), {"real-host"}, False, None),
        (
            ("real-host", "reset"),
            {"real-host", "reset"},
            False,
            "capability 'reset' changes host h: run with --allow-destructive",
        ),
    ],
)
def test_the_reason_names_the_host_and_the_capability(needed, offered, allow, reason):
    assert unmet(needed, frozenset(offered), "h", allow) == reason


def test_changing_only_keeps_the_tests_that_change_the_host(tmp_path):
    """--changing-only: a test marked destructive or needing a capability that changes the host
    (aer-fatal, orderly-removal) is kept; one needing only what a read-only run may use is not."""
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n\n@pytest.mark.destructive\ndef test_marked(host):\n    pass\n"
    )
    result = inner_run(tmp_path, "--host", "real:local", "--collect-only", "--changing-only")
    collected = {line.rsplit("::", 1)[-1] for line in result.stdout.splitlines() if "::" in line}
    assert result.returncode == 0, result.stdout + result.stderr
    assert collected == {"test_read_only", "test_factory", "test_marked"}, result.stdout
    assert "(3 deselected)" in result.stdout, result.stdout
