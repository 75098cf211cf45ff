"""fixtures/plugin_life_watch.py: DP-02/DP-03 rules judged on every ListAndWatch message of a device
plugin's life under the kubelet stand-in, with recorded message sequences (no VM): what a correct
plugin of any style does passes (opaque IDs, replicas, devices dropped or kept Unhealthy, a
device back at another address), what breaks a rule is a finding naming the message; and, in a
real pytest process, a finding after a test's window fails the run naming that test, counted
against the clause by the run record and the self-check (fixtures/transition_watch.py)."""

from __future__ import annotations

import types

import pytest

from hilconform.fixtures import plugin_life_watch
from hilconform.fixtures.node_plugin import PluginExited
from hilconform.fixtures.plugin_life_watch import ListJudge, PluginLifeWatch
from hilconform.fixtures.plugin_ties import Tie
from hilconform.reports import self_check

R = "hilconform.io/a100-sxm4"
A, B, C = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"


def message(seq: int, devices: list[tuple[str, str]], resource: str = R,
            kind: str = "list_and_watch") -> dict:
    return {"seq": seq, "ts_ns": seq * 1000, "kind": kind, "resource": resource,
            "message": {"devices": [{"ID": i, "health": h, "topology": None} for i, h in devices]}}


def fed(judge: ListJudge, records: list[dict]) -> list[tuple[str, str]]:
    return [v for r in records for v in judge.feed(r)]


def ties(**bdfs: str) -> dict[str, tuple[frozenset, str]]:
    return {i: (frozenset(b.split("/")), f"{b}: device node /dev/x") for i, b in bdfs.items()}


# -- what a correct plugin does, in the styles DP-02 allows ----------------------------------------

def test_a_correct_plugins_life_breaks_no_rule():
    """Registration, a loss (Unhealthy, then dropped), a return, a kubelet restart with a partial
    message first, an added device, messages that change nothing: no finding."""
    judge = ListJudge()
    life = [
        {"seq": 1, "kind": "register_request", "resource": R, "message": {"version": "v1beta1"}},
        message(2, [("gpu-a", "Healthy"), ("gpu-b", "Healthy")]),
        message(3, [("gpu-a", "Unhealthy"), ("gpu-b", "Healthy")]),
        message(4, [("gpu-b", "Healthy")]),
        message(5, [("gpu-a", "Healthy"), ("gpu-b", "Healthy")]),
        message(6, [("gpu-a", "Healthy")]),  # a new stream after a kubelet restart: partial first
        message(7, [("gpu-a", "Healthy"), ("gpu-b", "Healthy"), ("gpu-c", "Healthy")]),
        message(8, [("gpu-a", "Healthy"), ("gpu-b", "Healthy"), ("gpu-c", "Healthy")]),
    ]
    assert fed(judge, life) == []
    assert judge.messages == 7


def test_replicas_several_ids_per_device_are_distinct_ids_not_duplicates():
    judge = ListJudge()
    replicas = [(f"GPU-{d}::{n}", "Healthy") for d in "ab" for n in range(4)]
    assert fed(judge, [message(1, replicas)]) == []
    # the plugin ties all four replicas of a device to it: one device, several IDs, each stable
    assert judge.note_ties(R, ties(**{"GPU-a::0": A, "GPU-a::1": A, "GPU-b::0": B}), 1, 1) == []
    assert judge.note_ties(R, ties(**{"GPU-a::0": A, "GPU-a::1": A, "GPU-b::0": B}), 1, 1) == []


def test_an_id_tied_to_several_functions_then_fewer_stands_for_the_same_device():
    """A multi-function device (its IOMMU group holds two managed functions), one function gone
    later: overlapping sets are the same device."""
    judge = ListJudge()
    fed(judge, [message(1, [("x", "Healthy")])])
    assert judge.note_ties(R, ties(x=f"{A}/{B}"), 1, 1) == []
    assert judge.note_ties(R, ties(x=A), 1, 1) == []


def test_a_device_back_at_another_address_after_a_break_is_not_compared():
    """Left out (or Unhealthy) in between: the unit came back, maybe renumbered by a rescan or in
    another slot; its ID may stand for the new address."""
    for gone in ([], [("x", "Unhealthy")]):
        judge = ListJudge()
        fed(judge, [message(1, [("x", "Healthy"), ("y", "Healthy")])])
        judge.note_ties(R, ties(x=A, y=B), 1, 1)
        fed(judge, [message(2, [*gone, ("y", "Healthy")]), message(3, [("x", "Healthy"), ("y", "Healthy")])])
        assert judge.note_ties(R, ties(x=C), 3, 3) == [], gone


def test_a_tie_whose_allocate_may_have_come_across_a_break_is_not_used():
    judge = ListJudge()
    fed(judge, [message(1, [("x", "Healthy")])])
    judge.note_ties(R, ties(x=A), 1, 1)
    fed(judge, [message(2, []), message(3, [("x", "Healthy")])])
    assert judge.note_ties(R, ties(x=B), 1, 3) == []  # asked after 1, read to 3: across the break
    assert judge.note_ties(R, ties(x=B), 3, 3) == []  # the first tie of the run from 3
    assert judge.note_ties(R, ties(x=A), 3, 4) != []  # and the run's second one is compared with it


def test_an_id_not_healthy_when_allocate_was_asked_is_not_used():
    judge = ListJudge()
    fed(judge, [message(1, [("x", "Unhealthy")])])
    assert judge.note_ties(R, ties(x=A), 1, 1) == []
    fed(judge, [message(2, [("x", "Healthy")])])
    assert judge.note_ties(R, ties(x=B), 2, 2) == []  # nothing from the Unhealthy time to compare with


def test_the_same_id_under_two_resources_is_two_ids():
    judge = ListJudge()
    fed(judge, [message(1, [("0", "Healthy")]), message(2, [("0", "Healthy")], resource="example.com/t4")])
    judge.note_ties(R, ties(**{"0": A}), 2, 2)
    assert judge.note_ties("example.com/t4", ties(**{"0": B}), 2, 2) == []


# -- what breaks a rule ------------------------------------------------------------------------------

def test_an_id_listed_twice_in_a_later_message_is_a_dp02_finding_naming_the_message():
    judge = ListJudge()
    found = fed(judge, [message(1, [("a", "Healthy"), ("b", "Healthy")]),
                        message(9, [("a", "Healthy"), ("b", "Healthy"), ("b", "Healthy")])])
    assert len(found) == 1
    clause, text = found[0]
    assert clause == "DP-02" and "message 9" in text and "lists b more than once" in text, text


def test_a_health_value_the_api_does_not_know_is_a_dp02_finding():
    found = fed(ListJudge(), [message(1, [("a", "healthy"), ("b", ""), ("c", "Unhealthy")])])
    assert len(found) == 1 and found[0][0] == "DP-02"
    assert "a the health 'healthy'" in found[0][1] and "b the health ''" in found[0][1], found


def test_an_id_that_moves_onto_another_device_without_a_break_is_a_dp02_finding():
    """The rescan bug: a few seconds after a device came back, the ID it has stands for the other
    device (Allocate hands out the wrong card), while every message lists the same IDs Healthy."""
    judge = ListJudge()
    fed(judge, [message(1, [("x", "Healthy"), ("y", "Healthy")])])
    assert judge.note_ties(R, ties(x=A, y=B), 1, 1) == []
    fed(judge, [message(2, [("x", "Healthy"), ("y", "Healthy")])])  # a repeat: no break
    found = judge.note_ties(R, ties(x=B, y=B), 2, 2)
    assert [c for c, _ in found] == ["DP-02"], found
    assert "ID x" in found[0][1] and f"stood for {A}" in found[0][1] and f"now stands for {B}" in found[0][1]
    assert judge.ties_compared == 2


def test_tied_healthy_names_the_ids_to_ask_again_at_the_end():
    judge = ListJudge()
    fed(judge, [message(1, [("x", "Healthy"), ("y", "Healthy"), ("z", "Healthy")])])
    judge.note_ties(R, ties(x=A, y=B), 1, 1)
    fed(judge, [message(2, [("x", "Healthy"), ("y", "Unhealthy"), ("z", "Healthy")])])
    assert judge.tied_healthy() == {R: ["x"]}  # y broke its run; z was never tied


# -- the watch: fed as the stand-in's records are read, windows, the end ---------------------------

class FedKubelet:
    """A NodeKubelet without a node: the test appends the records the stand-in "journaled"."""

    def __init__(self, host):
        self.host, self.life_watch, self.journal = host, None, []

    def add(self, devices, resource=R):
        self.journal.append(message(len(self.journal) + 1, devices, resource))

    def records(self, since_seq=0):
        found = [r for r in self.journal if r["seq"] > since_seq]
        if self.life_watch is not None:
            self.life_watch.feed(found)
        return found


def test_the_watch_judges_each_record_once_and_tags_it_after_the_last_window(monkeypatch):
    kubelet = FedKubelet(types.SimpleNamespace(name="h"))
    watch = plugin_life_watch.follow(kubelet)
    kubelet.add([("a", "Healthy"), ("a", "Healthy")])
    kubelet.records(0)
    kubelet.records(0)  # read again by another wait: judged once
    assert [(f.clause, f.seq, f.after_test) for f in watch.take_unreported()] == [("DP-02", 1, None)]
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "suites/x.py::test_y (call)")
    watch.settle(kubelet.host, types.SimpleNamespace(resources=[]))
    kubelet.add([("a", "Healthy"), ("a", "Healthy")])
    plugin_life_watch.end(kubelet)
    found = watch.take_unreported()
    assert [(f.clause, f.seq, f.after_test) for f in found] == [("DP-02", 2, "suites/x.py::test_y")]
    assert found[0].text.startswith("h: ListAndWatch message 2")
    assert watch.ended and kubelet.life_watch is None
    kubelet.add([("a", "Healthy"), ("a", "Healthy")])  # after its end: not the watch's
    assert watch.feed(kubelet.journal) == []


def test_the_end_reads_on_after_a_recent_change_and_judges_a_plugin_gone(monkeypatch):
    monkeypatch.setattr(plugin_life_watch, "SETTLE_WATCH_S", 0.6)
    kubelet = FedKubelet(types.SimpleNamespace(name="h"))
    watch = PluginLifeWatch(kubelet, "h")
    kubelet.life_watch = watch
    kubelet.add([("a", "Healthy")])
    kubelet.add([("a", "Healthy"), ("b", "Healthy")])  # a change: the end watches on after it
    kubelet.records(0)

    class Gone:
        resources: list = []

        def check_running(self):
            kubelet.add([("b", "Healthy"), ("b", "Healthy")])  # sent during the watch's reading on
            raise PluginExited("the device plugin t exit status 1 while the test needed it; its last lines")

    import threading
    threading.Timer(0.2, kubelet.add, ([("a", "Healthy"), ("a", "Healthy")],)).start()
    watch.settle(kubelet.host, Gone())
    found = watch.take_unreported()
    assert [(f.clause, f.seq) for f in found] == [("DP-02", 3), ("DP-03", 3), ("DP-02", 4)], found
    assert "keeps serving" in found[1].text
    assert any("watched the plugin" in n for n in watch.notes), watch.notes
    assert any("the plugin's end watched in" in n for n in watch.notes), watch.notes


def test_the_end_asks_the_tied_ids_again_through_plugin_ties(monkeypatch):
    """At the end, the IDs tied in their current Healthy run are tied again (plugin_ties, which
    reports its ties to the stand-in's watch): one that moved is a finding."""
    kubelet = FedKubelet(types.SimpleNamespace(name="h"))
    watch = PluginLifeWatch(kubelet, "h")
    kubelet.life_watch = watch
    kubelet.add([("x", "Healthy"), ("y", "Healthy")])
    watch.note_ties(R, {"x": Tie("x", bdfs=frozenset({A}), via=[f"{A}: node"]),
                        "y": Tie("y", bdfs=frozenset({B}), via=[f"{B}: node"])}, watch.mark())
    asked = []

    def tie_again(host, kubelet_, resource, ids, topologies, managed):
        asked.append((resource, ids, managed))
        kubelet_.life_watch.note_ties(resource, {i: Tie(i, bdfs=frozenset({B}), via=["moved"]) for i in ids},
                                      kubelet_.life_watch.mark())

    monkeypatch.setattr("hilconform.fixtures.plugin_ties.plugin_ties", tie_again)
    plugin = types.SimpleNamespace(resources=[types.SimpleNamespace(name=R)], managed=lambda r: [A, B])
    watch.settle(kubelet.host, plugin)
    assert asked == [(R, ["x", "y"], [A, B])]
    found = watch.take_unreported()
    assert [f.clause for f in found] == ["DP-02"] and "ID x" in found[0].text, found


def test_the_watchs_own_trouble_is_a_note_never_a_finding():
    class Broken(FedKubelet):
        def records(self, since_seq=0):
            raise OSError("the node does not answer")

    kubelet = Broken(types.SimpleNamespace(name="h"))
    watch = plugin_life_watch.follow(kubelet)
    plugin_life_watch.take_ended_notes()
    watch.settle(kubelet.host, types.SimpleNamespace(resources=[]))
    plugin_life_watch.end(kubelet)
    notes = plugin_life_watch.take_ended_notes()  # the test's report section shows them
    assert watch.take_unreported() == [] and len(notes) == 3, notes
    assert "could not be watched" in notes[0] and "could not be read" in notes[1], notes
    assert "0 ListAndWatch message(s) judged" in notes[2], notes


# -- in a pytest process: reported by the test watch, counted against DP-02 ------------------------

TESTS = '''
import types
import pytest
from hilconform.fixtures import plugin_life_watch
from hilconform.fixtures.host import EmulatedHost

R = "hilconform.io/a100-sxm4"


def stand_in():
    vm = types.SimpleNamespace(layout=None, qemu=None, agent=None, runtime_config=None,
                               console_tail=lambda n: "", console_log=lambda: "",
                               qmp_events_text=lambda: "", check_alive=lambda: None)
    return EmulatedHost(vm=vm, name="stand-in", _runtime=None)


class FedKubelet:
    def __init__(self, host):
        self.host, self.life_watch, self.journal = host, None, []

    def add(self, *ids):
        self.journal.append({"seq": len(self.journal) + 1, "kind": "list_and_watch", "resource": R,
                             "message": {"devices": [{"ID": i, "health": "Healthy"} for i in ids]}})

    def records(self, since_seq=0):
        found = [r for r in self.journal if r["seq"] > since_seq]
        if self.life_watch is not None:
            self.life_watch.feed(found)
        return found


@pytest.fixture
def host():
    return stand_in()


@pytest.mark.clause("DP-04")
def test_its_plugin_lists_an_id_twice_after_its_checks(host):
    kubelet = FedKubelet(host)
    plugin_life_watch.follow(kubelet)
    kubelet.add("a", "b")
    kubelet.records(0)  # the test's own checks: all distinct
    plugin_life_watch.settle(kubelet, host, types.SimpleNamespace(resources=[]))  # its block ended
    kubelet.add("a", "b", "b")  # a rescan after the test's checks, before the stand-in stops
    plugin_life_watch.end(kubelet)


@pytest.mark.clause("DP-05")
def test_its_plugin_keeps_the_rules(host):
    kubelet = FedKubelet(host)
    plugin_life_watch.follow(kubelet)
    kubelet.add("a")
    kubelet.add("a", "c")
    plugin_life_watch.end(kubelet)


@pytest.fixture
def stand_in_to_teardown(host):
    kubelet = FedKubelet(host)
    plugin_life_watch.follow(kubelet)
    kubelet.add("a")
    yield kubelet
    kubelet.add("a", "a")  # after the test's call
    plugin_life_watch.end(kubelet)


@pytest.mark.clause("DP-08")
def test_last_whose_stand_in_outlives_the_call(stand_in_to_teardown):
    pass
'''


def test_a_finding_after_a_tests_window_fails_the_run_naming_that_test(watched_session):
    tests, junit, stdout = watched_session(TESTS, "test_plugin_watched.py")
    seen = {name: (r["outcome"], r.get("also_failed", [])) for name, r in tests.items()}
    assert seen == {
        "test_its_plugin_lists_an_id_twice_after_its_checks": ("failed", ["DP-02"]),
        "test_its_plugin_keeps_the_rules": ("passed", []),
        "test_last_whose_stand_in_outlives_the_call": ("failed", ["DP-02"]),
    }, stdout[-4000:]
    assert "2 ListAndWatch message(s) judged over the device plugin's life under the stand-in" in stdout
    twice = tests["test_its_plugin_lists_an_id_twice_after_its_checks"]["message"]
    assert "lists b more than once" in twice, twice
    assert "after test test_plugin_watched.py::test_its_plugin_lists_an_id_twice_after_its_checks" in twice
    assert "device plugin's whole life" in twice, twice
    outcomes = {n.split("::")[1]: o for n, o in self_check.read_junit(junit).items()}
    late = outcomes["test_last_whose_stand_in_outlives_the_call"]
    assert (late.outcome, late.also_failed) == ("failed", ["DP-02"]), late
    assert outcomes["test_its_plugin_lists_an_id_twice_after_its_checks"].own_clause_passed
    # a mutant breaking DP-02 is killed by a DP-04 test failed by the watch alone
    mutant = self_check.Mutant("m", "hilconform.tests.mutants.m", "DP-02", "x",
                               ("test_plugin_watched.py::test_its_plugin_lists_an_id_twice_after_its_checks",),
                               False)
    case = outcomes["test_its_plugin_lists_an_id_twice_after_its_checks"]
    case.identities = ["m"]
    assert self_check.judge_mutant(mutant, {mutant.tests[0]: case})[0] == "killed"


@pytest.mark.parametrize("status", ["", "0"])
def test_a_plugin_stopped_by_the_harness_is_not_gone(status):
    """PluginExited is reused as it is: the harness's own stop is no finding."""
    from hilconform.fixtures.node_plugin import NodePlugin

    plugin = NodePlugin.__new__(NodePlugin)
    plugin.stopping = status == "0"
    assert plugin.exited(status) is None


def test_kubelet_with_plugin_follows_its_stand_in_and_reads_on_before_the_stand_in_stops(monkeypatch):
    """The wiring: a stand-in the block starts is followed from its first record; when the block
    ends normally the watch settles (reads on, asks again) before the stand-in stops; a record the
    plugin sent then is judged after the test's window; a block that failed is not read on."""
    from hilconform.emulators.profile import load_profile
    from hilconform.fixtures import device_plugin
    from hilconform.fixtures.device_plugin import PluginChoice, kubelet_with_plugin
    from hilconform.fixtures.kubelet_site import GUEST_SITE

    host = types.SimpleNamespace(
        name="h", profile=load_profile("a100-stock"), runtime=types.SimpleNamespace(hello={}),
        runtime_overrides=dict(device_plugin.FRONT_END_ON), get=lambda wanted: host,
        device_plugin_resources=lambda: {"1b36:0010": R}, kubelet_site=lambda: GUEST_SITE,
        runtime_log=lambda: "")
    order = []

    class StandIn(FedKubelet):
        def __init__(self, host_):
            super().__init__(host_)
            self.register_versions = set()

        def start(self):
            order.append("start")

        def stop(self):
            order.append(("stop", self.life_watch))
            self.add([("a", "Healthy"), ("a", "Healthy")])  # after the watch ended: not judged

        def log(self):
            return ""

    original = PluginLifeWatch.settle

    def settle(watch, host_, plugin):
        order.append("settle")
        watch.kubelet.add([("a", "Healthy"), ("a", "Healthy")])  # the plugin's rescan, after the checks
        original(watch, host_, plugin)

    monkeypatch.setattr(device_plugin, "NodeKubelet", StandIn)
    monkeypatch.setattr(PluginLifeWatch, "settle", settle)
    monkeypatch.setattr(plugin_life_watch, "SETTLE_WATCH_S", 0.0)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "suites/d.py::test_d (call)")
    with kubelet_with_plugin(host, PluginChoice(), booted=True) as (kubelet, _plugin):
        watch = kubelet.life_watch
        kubelet.add([("a", "Healthy")])
        kubelet.records(0)
    assert order == ["start", "settle", ("stop", None)] and watch.ended
    found = watch.take_unreported()
    assert [(f.seq, f.after_test) for f in found] == [(2, "suites/d.py::test_d")], found

    order.clear()
    with pytest.raises(AssertionError), kubelet_with_plugin(host, PluginChoice(), booted=True):
        raise AssertionError("the test's own finding")
    assert order == ["start", ("stop", None)]
