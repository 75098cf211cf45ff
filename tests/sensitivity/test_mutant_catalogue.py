"""Unit checks of the mutant catalogue and the sensitivity runner's judging (no VM).

Why: a catalogue entry naming a test that does not exist, or a clause the test is not
marked with, or a mutant whose patch target was renamed in runtime/, would make a
sensitivity run report "broken" or, worse, judge the wrong thing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hilconform.fixtures.clauses import known_clauses
from hilconform.fixtures.transition_watch import WATCHED_CLAUSES
from hilconform.reports import self_check as rs

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = ROOT / "tests" / "mutants"
CATALOGUE = rs.load_catalogue()


def test_at_least_twelve_mutants_each_with_its_module_and_a_known_clause():
    assert len(CATALOGUE) >= 12
    clauses = set(known_clauses())
    for mutant in CATALOGUE:
        assert mutant.module == f"hilconform.tests.mutants.{mutant.name}", mutant
        source = (MUTANTS_DIR / f"{mutant.name}.py").read_text()
        assert mutant.breaks in clauses, mutant
        docstring = source.split('"""')[1]
        assert mutant.breaks in docstring, f"{mutant.name}: the docstring must name {mutant.breaks}"
        assert f'launch("{mutant.name}", apply)' in source, f"{mutant.name} must announce its own name"


def test_every_selected_test_exists_and_is_marked_with_the_clause_broken():
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--collect-only", "-q", "--list-clauses",
         "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    marked = set(re.findall(r"^clause (\S+) (\S+)$", listed.stdout, re.M))
    assert marked, listed.stdout[-2000:] + listed.stderr[-2000:]
    watched = {nodeid for _, nodeid in marked}  # every clause-marked test's events are checked for LIFE-01
    for mutant in CATALOGUE:
        for nodeid in mutant.tests:
            by_watch = nodeid in watched and mutant.breaks in WATCHED_CLAUSES and (  # a whole-life watch's
                mutant.breaks == WATCHED_CLAUSES[0] or nodeid.startswith("suites/deviceplugin/"))
            assert (mutant.breaks, nodeid) in marked or by_watch, (
                f"{mutant.name}: {nodeid} is not a {mutant.breaks} test")


def test_ci_subset_covers_every_area():
    areas = {m.breaks.split("-")[0] for m in CATALOGUE if m.ci}
    assert areas == {m.breaks.split("-")[0] for m in CATALOGUE}, areas


def test_every_mutant_applies_to_the_runtime_as_the_guest_imports_it(tmp_path):
    """The guest's import layout (hilconform/{runtime,tests} under PYTHONPATH), without site-packages."""
    package = tmp_path / "hilconform"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runtime").symlink_to(ROOT / "runtime")
    (package / "tests").symlink_to(ROOT / "tests")
    script = (
        "import importlib, sys\n"
        "import hilconform.runtime.service as service\n"
        "assert service.__file__.startswith(sys.argv[1]), service.__file__\n"
        "from hilconform.tests.mutants import launch\n"
        "for name in sys.argv[2:]:\n"
        "    module = importlib.import_module('hilconform.tests.mutants.' + name)\n"
        "    module.apply()\n"
        "launch.announce('probe')\n"
        "print('applied', len(sys.argv) - 2)\n"
    )
    names = [m.name for m in CATALOGUE]
    # grpcio (the device-plugin mutants patch the front end) is a system package in the guest;
    # here its folder goes on the path alone (-S: no .pth files, so not this checkout's install).
    import grpc

    grpc_home = str(Path(grpc.__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-S", "-c", script, str(tmp_path), *names],
                          env={"PYTHONPATH": f"{tmp_path}:{grpc_home}", "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"applied {len(names)}"


def _outcome(nodeid, outcome, clause="HP-02", identities=("m",)):
    return rs.TestOutcome(nodeid, outcome, clause=clause, identities=list(identities))


MUTANT = rs.Mutant("m", "hilconform.tests.mutants.m", "HP-02", "breaks it", ("a.py::t1", "a.py::t2"), True)


@pytest.mark.parametrize(("outcomes", "verdict"), [
    ({"a.py::t1": _outcome("a.py::t1", "failed"), "a.py::t2": _outcome("a.py::t2", "passed")}, "killed"),
    ({"a.py::t1": _outcome("a.py::t1", "passed"), "a.py::t2": _outcome("a.py::t2", "skipped")}, "survived"),
    ({"a.py::t1": _outcome("a.py::t1", "failed", clause="HP-01"),
      "a.py::t2": _outcome("a.py::t2", "passed")}, "survived"),
    ({"a.py::t1": _outcome("a.py::t1", "error"), "a.py::t2": _outcome("a.py::t2", "passed")}, "broken"),
    ({"a.py::t1": _outcome("a.py::t1", "passed")}, "broken"),  # t2 missing from the JUnit
    ({"a.py::t1": _outcome("a.py::t1", "failed", identities=()),
      "a.py::t2": _outcome("a.py::t2", "passed", identities=())}, "broken"),  # never saw the mutant
    ({"a.py::t1": _outcome("a.py::t1", "failed", identities=("reference",)),
      "a.py::t2": _outcome("a.py::t2", "passed")}, "broken"),  # the guest ran something else
], ids=["killed", "survived", "other-clause-failed", "error", "missing", "no-identity", "foreign"])
def test_judge_mutant(outcomes, verdict):
    assert rs.judge_mutant(MUTANT, outcomes)[0] == verdict


def test_judge_reference_requires_every_test_to_pass():
    ref = ("reference",)
    passed = {"x::a": _outcome("x::a", "passed", identities=ref)}
    assert rs.judge_reference(["x::a"], passed)[0] == "passed"
    assert rs.judge_reference(["x::a"], {"x::a": _outcome("x::a", "skipped", identities=ref)})[0] == "failed"
    assert rs.judge_reference(["x::a"], {"x::a": _outcome("x::a", "error", identities=ref)})[0] == "broken"
    foreign = {"x::a": _outcome("x::a", "passed", identities=("m",))}
    assert rs.judge_reference(["x::a"], foreign)[0] == "broken"


def test_read_junit_takes_outcome_clause_and_identity(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="suites.hotplug.test_hp02" name="test_x[acpi]" time="3.5">'
        '<properties><property name="clause" value="HP-02"/>'
        '<property name="runtime_identity" value="skip_drain"/></properties>'
        '<failure message="AssertionError: drain ok">trace</failure></testcase>'
        '<testcase classname="suites.aer.test_a" name="test_y" time="1">'
        '<skipped message="no slot"/></testcase>'
        '</testsuite></testsuites>')
    outcomes = rs.read_junit(junit)
    x = outcomes["suites/hotplug/test_hp02.py::test_x[acpi]"]
    assert (x.outcome, x.clause, x.identities, x.seconds) == ("failed", "HP-02", ["skip_drain"], 3.5)
    assert x.message == "AssertionError: drain ok"
    assert outcomes["suites/aer/test_a.py::test_y"].outcome == "skipped"


def test_exit_code_survivor_over_broken_over_ok():
    def result(verdict):
        return rs.RunResult("n", "m", None, "", verdict, "", [], 0.0, 0, [])
    assert rs.exit_code([result("killed"), result("passed")]) == rs.EXIT_OK
    assert rs.exit_code([result("killed"), result("broken")]) == rs.EXIT_BROKEN
    assert rs.exit_code([result("survived"), result("broken")]) == rs.EXIT_SURVIVED
    assert rs.exit_code([result("killed"), result("failed")]) == rs.EXIT_SURVIVED


def test_unknown_mutant_is_refused_with_its_name(tmp_path, capsys):
    assert rs.main(["--mutant", "no_such_mutant", "--out", str(tmp_path)]) == rs.EXIT_BROKEN
    assert "no_such_mutant" in capsys.readouterr().err


def test_malformed_catalogue_names_the_entry_and_key(tmp_path):
    bad = tmp_path / "mutants.toml"
    bad.write_text('[[mutant]]\nname = "x"\nmodule = "m"\nbreaks = "HP-01"\nhow = "h"\n'
                   'tests = []\nci = true\n')
    with pytest.raises(rs.CatalogueError, match=r"mutant #1 \(x\).*tests"):
        rs.load_catalogue(bad)


def test_table_names_each_mutant_its_catchers_and_the_converse(tmp_path):
    killed = rs.RunResult("skip_drain", "m", "HP-02", "skips it", "killed", "1 of 1",
                          ["suites/h/t.py::test_a"], 12.0, 1, [])
    survived = rs.RunResult("other", "m", "HP-03", "waits", "survived", "every test passed", [], 9.0, 0, [])
    reference = rs.RunResult(rs.REFERENCE, "hilconform.runtime", None, "", "passed", "all 2 passed", [],
                             30.0, 0, [])
    env = {"date": "d", "host": "emulated:a100", "qemu": "7.2", "cores": 2, "load_before": 1.0,
           "load_after": 2.0}
    table = rs.markdown([killed, survived, reference], env, 60.0)
    assert "| `skip_drain` | HP-02 | skips it | `t.py::test_a` | killed | 12 |" in table
    assert "**SURVIVED**: every test passed" in table
    assert "1 of 2 mutants killed" in table and "**passed**" in table
    doc = tmp_path / "doc.md"
    doc.write_text(f"head\n{rs.TABLE_BEGIN}\nold\n{rs.TABLE_END}\ntail\n")
    rs.update_doc(doc, table)
    text = doc.read_text()
    assert "old" not in text and text.startswith("head\n") and text.endswith(f"{rs.TABLE_END}\ntail\n")
    assert table in text


def test_a_mutant_shown_only_under_load_is_left_out_of_an_idle_full_run():
    """drain_slow_under_load behaves as the reference when idle: an idle --full run would call it
    a survivor, proving nothing; the loaded benchmark runs it (self_check --under-load)."""
    catalogue = rs.load_catalogue()
    loaded = [m for m in catalogue if m.under_load]
    assert loaded and not any(m.ci for m in loaded)
    idle = rs.select(catalogue, None, True, "emulated:a100")
    assert not set(loaded) & set(idle) and set(loaded) <= set(rs.elsewhere(catalogue, idle))
    assert set(loaded) <= set(rs.select(catalogue, None, True, "emulated:a100", under_load=True))
    assert rs.select(catalogue, [loaded[0].name], False) == [loaded[0]]  # asked by name: run


def test_an_under_load_mutant_in_the_ci_subset_is_refused(tmp_path):
    bad = tmp_path / "mutants.toml"
    bad.write_text('[[mutant]]\nname = "m"\nmodule = "x"\nbreaks = "HP-03"\nhow = "h"\n'
                   'tests = ["a.py::t"]\nci = true\nunder_load = true\n')
    with pytest.raises(rs.CatalogueError, match="under_load"):
        rs.load_catalogue(bad)
