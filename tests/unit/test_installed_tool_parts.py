"""The pieces an installed hilconform stands on, without installing it: where it builds
(emulators/build_folder.py), which system packages it needs (emulators/host_packages.py), a
repository's own clauses (fixtures/own_clauses.py). The whole path, from a wheel into a fresh
virtualenv outside the checkout, is tests/integration/test_installed_tool.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hilconform.emulators import build_folder, host_packages
from hilconform.fixtures.own_clauses import OwnClauseError, read_own_clauses

SPEC_IDS = {"DISC-01", "DP-02"}


def test_a_checkout_builds_into_vm_images_build(monkeypatch):
    monkeypatch.delenv(build_folder.ENV, raising=False)
    assert build_folder.is_checkout()
    assert build_folder.build_folder() == build_folder.PACKAGE_ROOT / "vm-images" / "build"
    assert "make image" in build_folder.setup_hint("image")


def test_an_installed_tool_builds_into_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(build_folder.ENV, raising=False)
    monkeypatch.setattr(build_folder, "PACKAGE_ROOT", tmp_path / "site-packages" / "hilconform")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert build_folder.build_folder() == tmp_path / "cache" / "hilconform"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build_folder.build_folder() == tmp_path / "home" / ".cache" / "hilconform"
    assert build_folder.setup_hint("image") == "`hilconform setup` (as root)"
    monkeypatch.setenv(build_folder.ENV, str(tmp_path / "elsewhere"))
    assert build_folder.build_folder() == tmp_path / "elsewhere"


def test_make_setup_s_package_check_runs_before_any_virtualenv():
    """The Makefile's own command, run as `make setup` runs it (the checkout as working folder, a
    bare interpreter): it lists every package. A relative import it could not resolve there once
    made every fresh machine's setup install nothing."""
    makefile = (build_folder.PACKAGE_ROOT / "Makefile").read_text()
    command = re.search(r"^HOST_PACKAGES := (.+)$", makefile, re.M).group(1)
    argv = [sys.executable if word == "$(PYTHON)" else word for word in shlex.split(command)]
    done = subprocess.run([*argv, "list", "--group", "run", "--group", "test"], cwd=build_folder.PACKAGE_ROOT,
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [p.name for p in host_packages.read_packages()]


def test_the_host_packages_are_read_strictly(tmp_path):
    packages = host_packages.read_packages()
    assert {p.name for p in packages if p.group == "run"} >= {"qemu-system-x86", "debootstrap"}
    assert {p.name for p in packages if p.group == "test"} >= {"crun", "runc", "skopeo"}
    bad = tmp_path / "packages.toml"
    bad.write_text('[run.qemu]\ntool = "qemu"\nfor = "x"\nversion = "9"\n')
    with pytest.raises(host_packages.HostPackagesError, match=r"\[run.qemu\] has unknown key 'version'"):
        host_packages.read_packages(bad)
    bad.write_text('[runtime.qemu]\ntool = "qemu"\nfor = "x"\n')
    with pytest.raises(host_packages.HostPackagesError, match="unknown group"):
        host_packages.read_packages(bad)


def test_a_package_is_missing_when_it_is_not_installed(tmp_path):
    """By dpkg where there is one (dash is essential on Debian), else by its tool."""
    data = tmp_path / "packages.toml"
    data.write_text('[run.dash]\ntool = "sh"\nfor = "x"\n'
                    '[run.nothing]\ntool = "no-such-tool-here"\nfor = "y"\n')
    assert [p.name for p in host_packages.missing_packages(("run",), data)] == ["nothing"]


def _clauses(tmp_path: Path, text: str):
    path = tmp_path / "acme.toml"
    path.write_text(text)
    return read_own_clauses([path], SPEC_IDS)


def test_a_repositorys_own_clauses_are_read_with_their_budgets(tmp_path):
    clauses = _clauses(tmp_path, '[clauses.ACME-01]\nstatement = "s"\nbudgets = { answer_ms = 2000 }\n'
                                 '[clauses.ACME-02]\nstatement = "t"\n')
    assert clauses["ACME-01"].budgets == {"answer_ms": 2000.0} and clauses["ACME-02"].budgets == {}


@pytest.mark.parametrize(("text", "says"), [
    ('[clauses.acme-1]\nstatement = "s"\n', "letters, a dash and two digits"),
    ('[clauses.DISC-01]\nstatement = "s"\n', "already the spec's"),
    ('[clauses.ACME-01]\nstatment = "s"\n', r"\[clauses.ACME-01\] has unknown key 'statment'"),
    ('[clauses.ACME-01]\nbudgets = { a_ms = 1 }\n', r"\[clauses.ACME-01\] lacks 'statement'"),
    ('[clauses.ACME-01]\nstatement = 3\n', r"\[clauses.ACME-01\] statement must be a str"),
    ('[clauses.ACME-01]\nstatement = "s"\nbudgets = { a_ms = -1 }\n', "positive numbers"),
    ('[clause.ACME-01]\nstatement = "s"\n', "one table"),
    ('[clauses.ACME-01\n', "not valid TOML"),
])
def test_a_bad_clause_file_is_refused_naming_what_is_wrong(tmp_path, text, says):
    with pytest.raises(OwnClauseError, match=says):
        _clauses(tmp_path, text)


def test_packages_are_judged_by_dpkg_not_by_the_users_path(monkeypatch):
    """Issue 45 #5: a user's PATH lacks /usr/sbin (debootstrap, mkfs.ext4); dpkg still says they are
    installed. And a package dpkg does not have is missing whatever the PATH holds."""
    if not Path("/usr/bin/dpkg-query").exists():
        pytest.skip("no dpkg on this machine: the tool check decides")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    present = host_packages.HostPackage("e2fsprogs", "run", "mkfs.ext4", "t")
    assert present.installed()
    absent = host_packages.HostPackage("hilconform-no-such-package", "run", "sh", "t")
    assert not absent.installed()
