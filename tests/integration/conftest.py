"""Fixtures shared by the integration modules."""

from __future__ import annotations

import pytest
from stand_in_real_host import StandInHost, start_stand_in


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory) -> StandInHost:
    """The a100-stock guest as a stand-in real host, booted once per worker for every module that
    drives the real-host backend against it (test_real_host, test_real_host_bad_input): a boot
    with sshd is ~15 s and cannot be restored (its root file system stays writable). Each test
    puts back what it changes; a module that needs another profile defines its own."""
    host = start_stand_in(tmp_path_factory.mktemp("stand-in"))
    yield host
    host.vm.stop()
