"""A pytest plugin for the crash test of `hilconform certify` (test_certify.py): the pytest-xdist
worker that reaches the call phase of a test whose node ID contains $HILCONFORM_KILL_WORKER_AT
SIGKILLs itself, as a worker dies under an OOM killer or a segfault. Loaded only by that test
(`-p xdist_worker_killer` with this folder on PYTHONPATH); inert without the variable and in the
controller or a run without xdist."""

from __future__ import annotations

import os
import signal

ENV = "HILCONFORM_KILL_WORKER_AT"


def pytest_runtest_call(item) -> None:
    target = os.environ.get(ENV)
    if target and target in item.nodeid and os.environ.get("PYTEST_XDIST_WORKER"):
        os.kill(os.getpid(), signal.SIGKILL)
