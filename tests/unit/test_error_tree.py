"""One error tree: every error class of the harness is one of its kinds, and the tree's drawing
(hilconform.emulators.errors' docstring) names every one of them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from hilconform.emulators import errors
from hilconform.emulators.errors import BadInput, ConformanceFailure, HilconformError, InfrastructureError
from hilconform.fixtures.kubelet_node import StandInError
from hilconform.fixtures.runtime_client import RuntimeCallError

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ("emulators", "fixtures", "reports")
# Answers, not failures of anyone: what a test asserts on, or what ends one connection (the
# docstring says so); and private helpers of one module.
ANSWERS = {"RuntimeCallError", "StandInError", "ControlError", "ClientError", "MalformedMessage",
           "PeerClosed"}
ERROR_BASE_ENDINGS = ("Error", "Exception", "Failure", "Input", "Missing")
KINDS = (InfrastructureError, BadInput, ConformanceFailure)


def _error_classes() -> list[tuple[str, str]]:
    """(module, class) for every exception class defined in the harness's packages."""
    found = []
    for package in HARNESS:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and any(
                        getattr(base, "id", getattr(base, "attr", "")).endswith(ERROR_BASE_ENDINGS)
                        or getattr(base, "id", "") in {n for _, n in found} for base in node.bases):
                    module = ".".join(("hilconform", *path.relative_to(ROOT).with_suffix("").parts))
                    found.append((module, node.name))
    return found


ERROR_CLASSES = _error_classes()


def test_the_harness_defines_errors_to_check():
    assert len(ERROR_CLASSES) > 30


@pytest.mark.parametrize(("module", "name"), ERROR_CLASSES, ids=[n for _, n in ERROR_CLASSES])
def test_every_error_of_the_harness_is_one_kind_of_the_tree(module, name):
    cls = getattr(importlib.import_module(module), name)
    if name in ANSWERS or name == "Inconclusive":  # Inconclusive: pytest's outcome, tested below
        return
    kinds = [kind.__name__ for kind in KINDS if issubclass(cls, kind)]
    assert issubclass(cls, HilconformError) and len(kinds) == 1 or cls is HilconformError, (
        f"{module}.{name} is {kinds or 'no kind'}: an error of the harness is exactly one of "
        f"{[k.__name__ for k in KINDS]} (hilconform.emulators.errors)")


@pytest.mark.parametrize(("module", "name"), ERROR_CLASSES, ids=[n for _, n in ERROR_CLASSES])
def test_the_tree_drawing_names_every_error(module, name):
    assert name in errors.__doc__, f"{module}.{name} is missing from hilconform.emulators.errors' drawing"


def test_inconclusive_is_no_exception_that_a_broad_except_swallows():
    from hilconform.fixtures.errors import Inconclusive
    assert not issubclass(Inconclusive, Exception)


@pytest.mark.parametrize(("error", "when", "kind"), [
    (InfrastructureError("QEMU died"), "call", "broken"),
    (errors.ProfileError("profile x: key 'budgets.base'"), "call", "error"),
    (ConformanceFailure("drain gave up early"), "call", "failed"),
    (AssertionError("plain assert"), "call", "failed"),
    (KeyError("a test's own bug"), "setup", "error"),
    (KeyError("a reply without what the protocol promises"), "call", "failed"),
    (RuntimeCallError("allocate", "not_healthy", "refused"), "call", "failed"),
    (StandInError("plugin_error", "Allocate failed"), "call", "failed"),
])
def test_the_run_record_reports_each_kind_as_its_own_outcome(error, when, kind):
    from hilconform.fixtures.run_record import failure_kind
    try:
        raise error
    except BaseException:
        excinfo = pytest.ExceptionInfo.from_current()
    assert failure_kind(excinfo, when) == kind


def test_a_crash_that_began_in_the_test_bed_library_is_no_verdict():
    """The stall witness's sampler iterated a dict a hot-add grew (emulators/): once reported as a
    failed DISC-02 although the runtime had done nothing wrong."""
    from hilconform.emulators import thread_wait
    from hilconform.fixtures.run_record import failure_kind

    def sample():
        table = {1: 1}
        for key in table:  # what the sampler did while the test added a backend
            table[key + 1] = key
    sample.__code__ = sample.__code__.replace(co_filename=thread_wait.__file__)
    try:
        sample()
    except RuntimeError:
        excinfo = pytest.ExceptionInfo.from_current()
    assert failure_kind(excinfo, "call") == "error"
