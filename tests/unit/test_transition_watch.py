"""fixtures/transition_watch.py + fixtures/runtime_life_watch.py in a real pytest process: LIFE-01
judged on every event of a runtime's whole life, inside tests and between them, and each finding
counted against LIFE-01 by the run record and the self-check (the certificate's part:
tests/unit/reports/test_reports_also_failed.py). The hosts are stand-ins (an EmulatedHost without
a VM) whose runtime client the test itself feeds; no VM.
"""

from __future__ import annotations

from hilconform.fixtures.clauses import ALSO_FAILED_PROPERTY
from hilconform.reports import self_check

TESTS = '''
import types
import pytest
from hilconform.emulators.errors import QemuDied
from hilconform.fixtures import runtime_life_watch
from hilconform.fixtures.host import EmulatedHost
from hilconform.fixtures.runtime_client import RuntimeCallError, RuntimeClient
from hilconform.runtime.lifecycle import TransitionTable

DEV = "0000:01:00.0"


class FedClient(RuntimeClient):
    """A runtime client without a runtime: the test appends the events it "receives"."""

    def __init__(self, answers=True):
        super().__init__("/nonexistent")
        self.answers, self.seq = answers, 100

    def call(self, method, params=None, timeout_s=10.0):
        if method == "transitions" and self.answers:
            return TransitionTable.load().to_dict()
        if method == "subscribe":
            return {"seq": self.seq, "replayed": 0, "history_starts_at": 90}  # not from the start
        if method == "stats":
            return {"seq": self.seq}
        raise RuntimeCallError(method, "UNKNOWN_METHOD", "not here")

    def move(self, frm, to, cause, device=DEV, view="health"):
        self.seq += 1
        self._events.append({"event": "transition", "seq": self.seq, "ts_ns": self.seq, "data": {
            "device": device, "view": view, "from": frm, "to": to, "cause": cause,
            "checkpoint": {"name": "c", "ok": True}, "ts_ns": self.seq}})


def hot_add_then_health(client):
    """A hot-add up to its health move, whose paired main move is still to come."""
    client.move("POWER_OFF", "FIRMWARE_LOADED", "hot_add:firmware", view="main")
    client.move("DISCOVERED", "HEALTHY", "hot_add:hot_add")


def paired_main_move(client):
    client.move("FIRMWARE_LOADED", "INITIALIZED", "hot_add:hot_add", view="main")


def stand_in(client=None):
    vm = types.SimpleNamespace(layout=None, qemu=None, agent=None, runtime_config=None,
                               console_tail=lambda n: "", console_log=lambda: "",
                               qmp_events_text=lambda: "", check_alive=lambda: None)
    host = EmulatedHost(vm=vm, name="stand-in", _runtime=client)
    if client is not None:
        runtime_life_watch.follow(client, host.name)  # as EmulatedHost.runtime does on connect
    return host


@pytest.fixture
def host():
    host = stand_in(FedClient())
    yield host
    host.drop_runtime_client()  # as a host's close does: the watch reads the runtime to its end


@pytest.fixture
def host_factory():
    return types.SimpleNamespace(hosts=[])


def decay(client):
    """A DEGRADED device healing on its own: a cause the table never lets take the move."""
    client.move("HEALTHY", "DEGRADED", "aer:recovered_nonfatal")
    client.move("DEGRADED", "HEALTHY", "aer:decayed")


@pytest.mark.clause("HP-01")
def test_passes_but_its_events_break_life01(host):
    decay(host._runtime)

@pytest.mark.clause("HP-02")
def test_fails_on_its_own_clause_and_breaks_life01(host):
    decay(host._runtime)
    assert False, "its own finding"

@pytest.mark.clause("HP-03")
def test_breaks_the_test_bed_after_breaking_life01(host):
    decay(host._runtime)
    raise QemuDied("QEMU exited with status 1")

@pytest.mark.clause("HP-04")
def test_is_skipped_after_breaking_life01(host):
    decay(host._runtime)
    pytest.skip("lacks a capability")

@pytest.mark.clause("HP-04")
def test_carries_what_a_broken_and_a_skipped_test_saw(host):
    pass

@pytest.mark.clause("HP-05")
def test_keeps_the_rules(host):
    host._runtime.move("HEALTHY", "ALLOCATED", "allocate:L1")
    host._runtime.move("ALLOCATED", "RELEASED", "release:L1")
    host._runtime.move("RELEASED", "HEALTHY", "release_checkpoint:release:L1")

@pytest.mark.clause("HP-06")
def test_an_earlier_violation_is_not_this_tests(host, request):
    pass

@pytest.fixture
def dirty_host():
    client = FedClient()
    decay(client)  # before the test's call: not its events, but the run's
    host = stand_in(client)
    yield host
    host.drop_runtime_client()

@pytest.mark.clause("HP-06")
def test_reports_a_violation_from_before_its_window(dirty_host):
    dirty_host._runtime.move("HEALTHY", "ALLOCATED", "allocate:L2")

@pytest.fixture(scope="module")
def shared():
    """A host kept across tests, as a worker's shared host is."""
    host = stand_in(FedClient())
    yield host
    host.drop_runtime_client()

@pytest.fixture
def healed_between_tests(shared):
    shared._runtime.move("DEGRADED", "HEALTHY", "aer:decayed")  # after the last test's window ended
    return shared

@pytest.mark.clause("LIFE-05")
def test_leaves_a_device_degraded(shared):
    shared._runtime.move("HEALTHY", "DEGRADED", "aer:recovered_nonfatal")

@pytest.mark.clause("LIFE-03")
def test_after_which_the_runtime_heals_it_on_its_own(healed_between_tests):
    pass

@pytest.mark.clause("DISC-01")
def test_a_host_started_during_the_call_counts_from_its_first_event(host_factory):
    client = FedClient()
    decay(client)
    host_factory.hosts.append(stand_in(client))

@pytest.mark.clause("DISC-02")
def test_a_runtime_that_does_not_publish_its_table_is_not_judged(host_factory):
    client = FedClient(answers=False)
    decay(client)
    host_factory.hosts.append(stand_in(client))

@pytest.mark.clause("DISC-03")
def test_without_a_runtime(host_factory):
    host_factory.hosts.append(stand_in(None))

@pytest.mark.clause("HP-05")
def test_a_paired_main_move_in_flight_at_the_end_is_waited_for(host):
    import threading
    hot_add_then_health(host._runtime)
    threading.Timer(0.3, paired_main_move, (host._runtime,)).start()  # sent after the test's end

@pytest.mark.clause("HP-05")
def test_a_paired_main_move_that_never_comes_breaks_life01(host):
    hot_add_then_health(host._runtime)

class Exploding:
    @property
    def hosts(self):
        raise RuntimeError("a fixture value the watch cannot look into")

@pytest.fixture
def exploding():
    return Exploding()

@pytest.mark.clause("DISC-04")
def test_the_watchs_own_trouble_changes_nothing(exploding):
    pass

@pytest.mark.clause("DISC-05")
def test_a_later_test_reports_the_run_findings_left(host):
    pass

@pytest.fixture
def heals_at_teardown(host):
    yield
    host._runtime.move("HEALTHY", "DEGRADED", "aer:recovered_nonfatal")
    host._runtime.move("DEGRADED", "HEALTHY", "aer:decayed")  # after the last test's call

@pytest.mark.clause("DISC-06")
def test_the_last_test_reports_what_its_hosts_last_events_broke(heals_at_teardown):
    pass
'''


def test_every_violation_of_the_runtimes_life_is_counted_once_against_life01(watched_session):
    tests, junit_xml, stdout = watched_session(TESTS, "test_watched.py")
    junit = {nodeid.split("::")[1]: o for nodeid, o in self_check.read_junit(junit_xml).items()}
    seen = {name: (r["outcome"], r.get("also_failed", [])) for name, r in tests.items()}
    assert seen == {
        "test_passes_but_its_events_break_life01": ("failed", ["LIFE-01"]),
        "test_fails_on_its_own_clause_and_breaks_life01": ("failed", ["LIFE-01"]),
        "test_breaks_the_test_bed_after_breaking_life01": ("broken", []),
        "test_is_skipped_after_breaking_life01": ("skipped", []),
        "test_carries_what_a_broken_and_a_skipped_test_saw": ("failed", ["LIFE-01"]),
        "test_keeps_the_rules": ("passed", []),
        "test_an_earlier_violation_is_not_this_tests": ("passed", []),
        "test_reports_a_violation_from_before_its_window": ("failed", ["LIFE-01"]),
        "test_leaves_a_device_degraded": ("passed", []),
        "test_after_which_the_runtime_heals_it_on_its_own": ("failed", ["LIFE-01"]),
        "test_a_host_started_during_the_call_counts_from_its_first_event": ("failed", ["LIFE-01"]),
        "test_a_runtime_that_does_not_publish_its_table_is_not_judged": ("passed", []),
        "test_without_a_runtime": ("passed", []),
        "test_the_watchs_own_trouble_changes_nothing": ("passed", []),
        "test_a_paired_main_move_in_flight_at_the_end_is_waited_for": ("passed", []),
        "test_a_paired_main_move_that_never_comes_breaks_life01": ("passed", []),
        "test_a_later_test_reports_the_run_findings_left": ("failed", ["LIFE-01"]),
        "test_the_last_test_reports_what_its_hosts_last_events_broke": ("failed", ["LIFE-01"]),
    }, stdout[-4000:]
    own = {name for name, r in tests.items() if r.get("own_clause_passed")}
    assert own == {"test_passes_but_its_events_break_life01",
                   "test_carries_what_a_broken_and_a_skipped_test_saw",
                   "test_reports_a_violation_from_before_its_window",
                   "test_after_which_the_runtime_heals_it_on_its_own",
                   "test_a_host_started_during_the_call_counts_from_its_first_event",
                   "test_a_later_test_reports_the_run_findings_left",
                   "test_the_last_test_reports_what_its_hosts_last_events_broke"}, own
    message = tests["test_passes_but_its_events_break_life01"]["message"]
    assert "LIFE-01" in message and "cause kind 'aer' may not take it" in message, message
    assert "its own finding" in tests["test_fails_on_its_own_clause_and_breaks_life01"]["message"]
    carried = tests["test_carries_what_a_broken_and_a_skipped_test_saw"]["message"]
    assert "test_breaks_the_test_bed_after_breaking_life01" in carried, carried
    assert "test_is_skipped_after_breaking_life01" in carried, carried
    healed = tests["test_after_which_the_runtime_heals_it_on_its_own"]["message"]
    assert "after or in test_watched.py::test_leaves_a_device_degraded" in healed, healed
    assert "DEGRADED->HEALTHY (aer:decayed)" in healed, healed
    assert "before this test's window" in tests["test_reports_a_violation_from_before_its_window"]["message"]
    assert "FIRMWARE_LOADED -> INITIALIZED that the published combination pairs with" in (
        tests["test_a_later_test_reports_the_run_findings_left"]["message"])
    last = tests["test_the_last_test_reports_what_its_hosts_last_events_broke"]["message"]
    assert "aer:decayed" in last, last
    assert "the watch failed" in stdout and "transitions not judged" in stdout
    # the JUnit XML carries the property the self-check reads
    assert junit["test_passes_but_its_events_break_life01"].also_failed == ["LIFE-01"]
    assert junit["test_breaks_the_test_bed_after_breaking_life01"].also_failed == []
    assert junit["test_passes_but_its_events_break_life01"].own_clause_passed
    assert not junit["test_fails_on_its_own_clause_and_breaks_life01"].own_clause_passed
    assert junit["test_after_which_the_runtime_heals_it_on_its_own"].also_failed == ["LIFE-01"]
    # the last test's teardown finding is an error in the JUnit XML, and a finding for the self-check
    last = junit["test_the_last_test_reports_what_its_hosts_last_events_broke"]
    assert (last.outcome, last.also_failed) == ("failed", ["LIFE-01"]), last


def test_the_late_findings_name_is_the_errors():
    from hilconform.fixtures.clauses import LATE_FINDING
    from hilconform.fixtures.transition_watch import TransitionRulesBrokenAfterTheTests

    assert LATE_FINDING == TransitionRulesBrokenAfterTheTests.__name__


def test_the_self_check_takes_an_also_failed_clause_as_a_kill():
    mutant = self_check.Mutant("m", "hilconform.tests.mutants.m", "LIFE-01", "heals", ("a.py::t",), False)
    failed = self_check.TestOutcome("a.py::t", "failed", clause="LIFE-05", identities=["m"],
                                    also_failed=["LIFE-01"])
    assert self_check.judge_mutant(mutant, {"a.py::t": failed})[0] == "killed"
    failed.also_failed = []
    assert self_check.judge_mutant(mutant, {"a.py::t": failed})[0] == "survived"
    assert ALSO_FAILED_PROPERTY == "also_failed_clause"


def test_a_test_failed_by_the_watch_alone_kills_no_mutant_of_its_own_clause():
    """An HP-02 mutant is not "killed" by HP-02's test failing for a LIFE-01 violation alone."""
    mutant = self_check.Mutant("m", "hilconform.tests.mutants.m", "LIFE-05", "x", ("a.py::t",), False)
    failed = self_check.TestOutcome("a.py::t", "failed", clause="LIFE-05", identities=["m"],
                                    also_failed=["LIFE-01"], own_clause_passed=True)
    assert self_check.judge_mutant(mutant, {"a.py::t": failed})[0] == "survived"
    failed.own_clause_passed = False
    assert self_check.judge_mutant(mutant, {"a.py::t": failed})[0] == "killed"


def test_a_runtime_that_no_longer_answers_is_not_judged_on_what_only_its_end_could_show():
    """A runtime gone (the VM stopped) when its client is dropped between a health move and the main
    move the published combination pairs with it: not a finding; one that still answers and never
    sends the main move: a finding."""
    from hilconform.fixtures.runtime_client import RuntimeClient, RuntimeUnresponsive
    from hilconform.fixtures.runtime_life_watch import LifeWatch
    from hilconform.runtime.lifecycle import TransitionTable

    class Cut(RuntimeClient):
        def __init__(self, answers_at_end: bool):
            super().__init__("/nonexistent")
            self.answers_at_end, self.started = answers_at_end, False

        def call(self, method, params=None, timeout_s=10.0):
            if method == "transitions":
                return TransitionTable.load().to_dict()
            if method == "subscribe":
                self.started = True
                return {"seq": 0, "replayed": 0, "history_starts_at": 1}
            if not self.answers_at_end:
                raise RuntimeUnresponsive("no reply to stats within 10.0s")
            return {}

    def ended(answers_at_end: bool) -> list[str]:
        client = Cut(answers_at_end)
        watch = LifeWatch(client, "h")
        watch.start()
        client._events.append({"event": "transition", "seq": 5, "ts_ns": 5, "data": {
            "device": "0000:02:00.0", "view": "main", "from": "POWER_OFF", "to": "FIRMWARE_LOADED",
            "cause": "hot_add:firmware", "checkpoint": {"name": "c", "ok": True}, "ts_ns": 5}})
        client._events.append({"event": "transition", "seq": 6, "ts_ns": 6, "data": {
            "device": "0000:02:00.0", "view": "health", "from": "DISCOVERED", "to": "HEALTHY",
            "cause": "hot_add:boot", "checkpoint": {"name": "c", "ok": True}, "ts_ns": 6}})
        watch.end()
        return [f.clause for f in watch.take_unreported()]

    assert ended(answers_at_end=False) == []
    assert ended(answers_at_end=True) == ["LIFE-01"]
