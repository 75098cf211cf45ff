"""poll_until: the value once the probe gives one, an early way out, and a deadline error that
names what was awaited and the last thing seen."""

from __future__ import annotations

import itertools

import pytest

from hilconform.emulators.errors import FaultError, InfrastructureError, WaitTimeout
from hilconform.emulators.waiting import poll_until


def test_the_first_truthy_value_is_returned():
    answers = iter([None, [], ["nvme0n1"]])
    assert poll_until(lambda: next(answers), 5, "a block device", every_s=0.001) == ["nvme0n1"]


def test_the_deadline_names_what_was_awaited_and_the_last_value():
    counter = itertools.count()
    said = r"the queue draining: not within 0.05 s \(last seen: 0\)"
    with pytest.raises(WaitTimeout, match=said) as raised:
        poll_until(lambda: 0 * next(counter), 0.05, "the queue draining", every_s=0.01)
    assert isinstance(raised.value, InfrastructureError)  # the test bed's, never a failed clause


def test_check_gives_up_early_and_the_callers_error_family_is_kept():
    def died():
        raise InfrastructureError("qemu exited")

    with pytest.raises(InfrastructureError, match="qemu exited"):
        poll_until(lambda: None, 60, "anything", check=died)
    with pytest.raises(FaultError, match="aer-fatal at gpu0: a sign of"):
        poll_until(lambda: None, 0, "aer-fatal at gpu0: a sign of recovery", error=FaultError)
