"""Inconclusive is never green (fixtures/inconclusive_outcome.py), in a real pytest process.

Why in a process of its own (pytester's subprocess runs): the exit status is what a CI gate
reads, and the xdist cases need a controller with workers, as `make test` has. Each inner run
loads the hilconform plugin through its entry point, as a team's `pytest --host ...` does.
"""

from __future__ import annotations

import pytest

from hilconform.fixtures.inconclusive_outcome import OPTION
from hilconform.reports import certify
from hilconform.reports.run_folder import RunFolder

pytest_plugins = ["pytester"]

PASS_AND_INCONCLUSIVE = """
import pytest
from hilconform.fixtures.errors import Inconclusive

def test_passes():
    pass

def test_test_bed_missed_the_hold():
    raise Inconclusive("the hold ended before the runtime acted")

@pytest.fixture
def missed():
    raise Inconclusive("no CPU for the model's thread at setup")

def test_inconclusive_at_setup(missed):
    pass

def test_lacks_a_capability():
    pytest.skip("host lacks capability 'hotplug'")
"""

AND_A_FAILURE = PASS_AND_INCONCLUSIVE + """
def test_finds_a_problem():
    assert 1 == 2, "latency over budget"
"""

# -n 0: the process that runs the tests counts; -n 2: the xdist controller counts its workers' reports.
WORKERS = pytest.mark.parametrize("workers", ["0", "2"])


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch):
    """run(source, *args) -> RunResult of `pytest` on a one-file test module, in a subprocess."""
    for name in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                 "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)

    def _run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_sample=source)
        # -p no:labgrid as the project's addopts, and no hypothesis: 3 s of imports a process; -rfEs
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:labgrid", "-p",
                                             "no:hypothesispytest", "-rfEs", *args, timeout=180)
    return _run


@WORKERS
def test_an_inconclusive_is_its_own_outcome_and_the_session_exits_2(run, workers):
    result = run(PASS_AND_INCONCLUSIVE, "-n", workers)
    assert result.ret == 2, result.stdout.str()
    assert result.parseoutcomes() == {"passed": 1, "skipped": 1, "inconclusive": 2}, result.stdout.str()
    for inconclusive in (  # under xdist in the order the workers reported them
        "INCONCLUSIVE test_sample.py::test_test_bed_missed_the_hold - the hold ended before the runtime "
        "acted",
        "INCONCLUSIVE at setup of test_sample.py::test_inconclusive_at_setup - no CPU for the model's thread "
        "at setup",
    ):
        result.stdout.fnmatch_lines([
            "*= short test summary info =*",
            "SKIPPED *host lacks capability 'hotplug'",
            inconclusive,
            f"hilconform: 2 inconclusive: exit 2 (inconclusive is never green; {OPTION} keeps pytest's exit "
            "status)",
        ])


@WORKERS
def test_a_failure_beside_an_inconclusive_keeps_exit_1(run, workers):
    result = run(AND_A_FAILURE, "-n", workers)
    assert result.ret == 1, result.stdout.str()
    assert result.parseoutcomes() == {"passed": 1, "failed": 1, "skipped": 1, "inconclusive": 2}
    result.stdout.fnmatch_lines(["FAILED test_sample.py::test_finds_a_problem - AssertionError*",
                                 "INCONCLUSIVE test_sample.py::test_test_bed_missed_the_hold - *"])
    result.stdout.no_fnmatch_line("hilconform: * inconclusive: exit 2*")


@WORKERS
def test_accept_inconclusive_keeps_pytests_exit_status_and_still_counts_them(run, workers):
    result = run(PASS_AND_INCONCLUSIVE, "-n", workers, OPTION)
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes() == {"passed": 1, "skipped": 1, "inconclusive": 2}
    result.stdout.fnmatch_lines(["INCONCLUSIVE test_sample.py::test_test_bed_missed_the_hold - *"])
    result.stdout.no_fnmatch_line("hilconform: * inconclusive: exit 2*")


def test_verbose_names_the_outcome_and_a_plain_skip_stays_a_skip(run):
    result = run(PASS_AND_INCONCLUSIVE, "-n", "0", "-v", "-k", "hold or capability")
    assert result.ret == 2, result.stdout.str()
    result.stdout.fnmatch_lines(["*::test_test_bed_missed_the_hold INCONCLUSIVE*",
                                 "*::test_lacks_a_capability SKIPPED*"])
    only_skip = run(PASS_AND_INCONCLUSIVE, "-n", "0", "-k", "passes or capability")
    assert only_skip.ret == 0 and only_skip.parseoutcomes() == {"passed": 1, "skipped": 1, "deselected": 2}


def test_a_worse_status_set_at_session_finish_is_kept(run, pytester):
    """fixtures/plugin.py turns a session whose QEMU outlived it into an internal error (3) in its own
    pytest_sessionfinish; the raise to 2 runs after every such hook and never lowers a status."""
    pytester.makeconftest("""
def pytest_sessionfinish(session):
    session.exitstatus = 3
""")
    result = run(PASS_AND_INCONCLUSIVE, "-n", "0")
    assert result.ret == 3, result.stdout.str()


def test_the_option_is_in_the_hilconform_help_group(pytester):
    result = pytester.runpytest_subprocess("-p", "no:labgrid", "--help")
    text = result.stdout.str()
    group = text[text.index("hilconform conformance suite:"):]
    assert OPTION in group.split("\n\n")[0], group[:3000]


def test_certify_accepts_inconclusive_from_pytest_and_judges_it_from_the_run_record(tmp_path):
    """certify's verdict on an inconclusive clause comes from the run record (incomplete, exit 2); its
    pytest must not exit 2 for it, which certify reads as an interrupted run (reports/verdicts.py)."""
    chosen = certify.CertifyOptions(host="emulated:a100")
    chosen.workers = certify.check_workers(chosen)
    assert OPTION in certify._pytest_argv(chosen, RunFolder(tmp_path / "run"), ["suites/aer"])
