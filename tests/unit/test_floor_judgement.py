"""Judging the runtime's share over the test bed's floor (fixtures/floor_judgement.py)."""

from __future__ import annotations

import pytest

from hilconform.fixtures.errors import Inconclusive, InfrastructureError
from hilconform.fixtures.floor_judgement import (
    FloorBudgets,
    TimerReport,
    judge_interval_over_stalls,
    judge_less_stalls,
    judge_over_floor,
    judge_timer,
)

KEYS = FloorBudgets(absolute="total_ms", share="share_ms", floor_limit="floor_limit_ms")
STALL_KEYS = FloorBudgets(absolute="total_ms", share="share_ms", floor_limit="floor_limit_ms",
                          stall_limit="stall_limit_ms")


class _Host:
    description = "a test host"

    def __init__(self, **budgets):
        self.budgets = budgets


class _Measurements:
    def __init__(self):
        self.recorded = {}

    def record(self, clause, name, values, unit, budget=None, budget_stat=None):
        from hilconform.fixtures.measurements import summarise

        summary = summarise(clause, name, values, unit, budget, budget_stat)
        self.recorded[name] = summary
        return summary


def _judge(host, totals, floors):
    measurements = _Measurements()
    judge_over_floor(host, measurements, "DISC-03", "cold", totals, floors, KEYS, stat="max")
    return measurements.recorded


def test_a_profile_without_a_share_budget_judges_the_whole_figure():
    host = _Host(total_ms=1500)
    recorded = _judge(host, [1000, 1400], [900, 1300])
    assert recorded["cold"].budget == 1500 and recorded["cold"].within_budget
    assert recorded["cold_over_floor"].values == [100, 100] and recorded["cold_over_floor"].budget is None
    with pytest.raises(AssertionError, match="MISSED"):
        _judge(host, [1000, 1600], [100, 100])  # a small floor does not excuse the total


def test_the_share_is_judged_and_the_total_only_recorded():
    host = _Host(total_ms=1500, share_ms=500, floor_limit_ms=3000)
    recorded = _judge(host, [2000, 2400], [1800, 2000])
    assert recorded["cold"].budget is None  # the absolute figure: recorded, not judged
    assert recorded["cold_over_floor"].max == 400 and recorded["cold_over_floor"].within_budget


def test_a_share_over_budget_on_a_test_bed_within_its_floor_limit_fails():
    host = _Host(share_ms=500, floor_limit_ms=3000)
    with pytest.raises(AssertionError, match="floor met its limit"):
        _judge(host, [1000, 2000], [900, 1000])


def test_a_share_over_budget_on_a_test_bed_over_its_floor_limit_is_inconclusive():
    host = _Host(share_ms=500, floor_limit_ms=3000)
    with pytest.raises(Inconclusive, match="too slow to judge"):
        _judge(host, [4000, 4500], [3500, 3100])


def test_a_share_within_budget_passes_however_slow_the_test_bed():
    host = _Host(share_ms=500, floor_limit_ms=3000)
    assert _judge(host, [9000], [8800])["cold_floor"].within_budget is False


def test_a_missing_floor_limit_is_a_test_bed_error():
    with pytest.raises(InfrastructureError, match="floor_limit_ms"):
        _judge(_Host(share_ms=500), [1000], [100])


def test_totals_and_floors_must_pair_up():
    with pytest.raises(ValueError):
        _judge(_Host(share_ms=500, floor_limit_ms=3000), [1000, 2000], [100])


# -- a timed interval judged over the node's stalls (HP-02/HP-03) ----------------------------------

def _judge_interval(host, total_ms, stall_ms, low=150, high=450):
    measurements = _Measurements()
    judge_interval_over_stalls(host, measurements, "HP-03", "give_up", total_ms, stall_ms, low, high,
                               "stall_limit_ms")
    return measurements.recorded


def test_an_interval_within_its_window_passes_whatever_the_profile():
    for host in (_Host(), _Host(stall_limit_ms=1000)):
        recorded = _judge_interval(host, 305, 0)
        assert recorded["give_up"].values == [305]


def test_an_early_interval_fails_whatever_the_stalls():
    for host in (_Host(), _Host(stall_limit_ms=1000)):
        with pytest.raises(AssertionError, match="earlier than 150"):
            _judge_interval(host, 100, 0)


def test_a_late_interval_on_a_profile_without_a_stall_limit_is_judged_whole():
    with pytest.raises(AssertionError, match="MISSED"):
        _judge_interval(_Host(), 653, 400)  # stalls do not excuse it on a real host


def test_a_late_interval_whose_stalls_account_for_it_passes():
    recorded = _judge_interval(_Host(stall_limit_ms=1000), 653, 350)
    assert recorded["give_up"].budget == 450 and not recorded["give_up"].within_budget  # late whole
    assert recorded["give_up_over_stalls"].max == 303 and recorded["give_up_over_stalls"].within_budget
    assert recorded["give_up_stalled"].within_budget


def test_a_late_interval_beyond_its_stalls_fails():
    with pytest.raises(AssertionError, match="even less the acting thread.s stall before its end"):
        _judge_interval(_Host(stall_limit_ms=1000), 3000, 200)  # a 3 s drain timeout


def test_a_late_interval_beyond_even_a_stall_over_its_limit_fails():
    """Less the whole 1.5 s stall the interval is still 1.5 s against 450: the runtime's own time,
    whatever stalled (a runtime that keeps the CPU busy makes its own stall)."""
    with pytest.raises(AssertionError, match="even less"):
        _judge_interval(_Host(stall_limit_ms=1000), 3000, 1500)


def test_a_late_interval_within_its_window_only_less_a_stall_over_its_limit_is_inconclusive():
    with pytest.raises(Inconclusive, match="too stalled to judge"):
        _judge_interval(_Host(stall_limit_ms=1000), 1600, 1500)


def test_a_late_interval_excused_only_by_a_stall_over_its_limit_is_never_a_pass():
    """The excuse is bounded: 653 ms less a 500 ms stall would be within 450, but a stall over the
    150 ms limit is more than the judged path ever needs."""
    with pytest.raises(Inconclusive, match="over its limit"):
        _judge_interval(_Host(stall_limit_ms=150), 653, 500)


def _judge_with_stalls(host, totals, floors, stalls, keys=STALL_KEYS):
    measurements = _Measurements()
    judge_over_floor(host, measurements, "DISC-03", "cold", totals, floors, keys, stat="max", stalls=stalls)
    return measurements.recorded


def test_each_sample_and_floor_is_taken_less_its_own_stalls():
    """DISC-03 at load 8 (2026-12-04): a 5.6 s start with 5.1 s of it stalled, a floor of 0.47 s."""
    host = _Host(share_ms=3500, floor_limit_ms=3000, stall_limit_ms=6000)
    recorded = _judge_with_stalls(host, [5630, 1000], [470, 900], ([5100, 0], [0, 400]))
    assert recorded["cold"].values == [5630, 1000]  # as measured
    assert recorded["cold_floor"].values == [470, 900] and recorded["cold_floor"].budget is None
    assert recorded["cold_floor_less_stalls"].values == [470, 500]
    assert recorded["cold_floor_less_stalls"].budget == 3000
    assert recorded["cold_over_floor"].values == [60, 500] and recorded["cold_over_floor"].within_budget
    assert recorded["cold_stalled"].values == [5100, 0] and recorded["cold_floor_stalled"].values == [0, 400]


def test_a_share_passed_only_by_stalls_over_their_limit_is_inconclusive():
    """The same start with a stall limit of 1 s: 5.1 s of stall is more than any series needs, so
    the share over budget whole is too stalled to judge, never a pass."""
    host = _Host(share_ms=3500, floor_limit_ms=3000, stall_limit_ms=1000)
    with pytest.raises(Inconclusive, match="too stalled to judge"):
        _judge_with_stalls(host, [5630, 1000], [470, 900], ([5100, 0], [0, 400]))
    recorded = _judge_with_stalls(host, [3000, 1000], [470, 900], ([2900, 0], [0, 0]))
    assert recorded["cold_over_floor_with_stalls"].within_budget  # within budget whole: no excuse needed


def test_stalls_without_a_stall_limit_are_recorded_not_subtracted():
    host = _Host(share_ms=3500, floor_limit_ms=3000, stall_limit_ms=6000)
    with pytest.raises(AssertionError, match="floor met its limit"):
        _judge_with_stalls(host, [5630, 1000], [470, 900], ([5100, 0], [0, 0]), keys=KEYS)


def test_a_slow_runtime_on_an_unstalled_node_still_fails():
    host = _Host(share_ms=3500, floor_limit_ms=3000, stall_limit_ms=6000)
    with pytest.raises(AssertionError, match="floor met its limit"):
        _judge_with_stalls(host, [4500, 1000], [450, 400], ([0, 0], [0, 0]))
    with pytest.raises(AssertionError, match="floor met its limit"):  # its stalls do not excuse its own time
        _judge_with_stalls(host, [6000, 1000], [450, 400], ([1500, 0], [0, 0]))


def test_a_real_host_judges_the_whole_figure_and_only_records_the_stalls():
    host = _Host(total_ms=1500)
    with pytest.raises(AssertionError, match="MISSED"):
        _judge_with_stalls(host, [1000, 1600], [100, 100], ([0, 900], [0, 0]))


def _judge_less_stalls(host, totals, stalls):
    measurements = _Measurements()
    judge_less_stalls(host, measurements, "DP-05", "advertised", totals, stalls, "total_ms", "stall_limit_ms",
                      stat="max")
    return measurements.recorded


def test_a_figure_over_budget_only_by_the_nodes_stalls_passes():
    """DP-05 at load 8 (2026-12-04): an add advertised after 5.6 s against 5 s."""
    host = _Host(total_ms=5000, stall_limit_ms=10000)
    recorded = _judge_less_stalls(host, [5622, 3258], [1200, 300])
    assert recorded["advertised"].budget == 5000 and recorded["advertised_stalled"].budget == 10000
    assert recorded["advertised_less_stalls"].values == [4422, 2958]
    assert recorded["advertised_less_stalls"].within_budget


def test_a_late_figure_fails_even_less_its_stalls_whatever_their_size():
    host = _Host(total_ms=5000, stall_limit_ms=10000)
    with pytest.raises(AssertionError, match="even less the acting thread.s stalls inside it"):
        _judge_less_stalls(host, [7000], [500])
    with pytest.raises(AssertionError, match="even less"):  # 18 s of its own, past a 12 s stall
        _judge_less_stalls(host, [30000], [12000])


def test_a_figure_passed_only_by_stalls_over_their_limit_is_inconclusive():
    host = _Host(total_ms=5000, stall_limit_ms=1000)
    with pytest.raises(Inconclusive, match="too stalled to judge"):
        _judge_less_stalls(host, [5622], [1200])


def test_without_a_stall_limit_the_whole_figure_is_judged():
    host = _Host(total_ms=5000)
    with pytest.raises(AssertionError, match="MISSED"):
        _judge_less_stalls(host, [5622], [1200])


def test_an_interval_whose_stall_is_not_known_is_judged_whole():
    with pytest.raises(AssertionError, match="MISSED"):
        _judge_interval(_Host(stall_limit_ms=1000), 653, None)


# -- a timer judged on the runtime's own deadline arithmetic (HP-03) --------------------------------

MS = 1_000_000


def _judge_timer(host, report, host_ms, end_stall_ms=0.0):
    measurements = _Measurements()
    judge_timer(host, measurements, "HP-03", "give_up", report, host_ms, 150, 450, 150, end_stall_ms,
                "stall_limit_ms")
    return measurements.recorded


def _report(gave_up_ms, deadline_ms=300):
    start = 5_000 * MS
    return TimerReport(start, start + deadline_ms * MS, start + int(gave_up_ms * MS))


def test_a_timer_that_gives_up_at_its_deadline_with_true_times_passes():
    recorded = _judge_timer(_Host(stall_limit_ms=300), _report(310), host_ms=380)
    assert recorded["give_up"].values == [310] and recorded["give_up_deadline"].values == [300]
    assert recorded["give_up_report_lag"].values == [70]


def test_a_late_give_up_on_the_runtimes_clock_fails_whatever_the_stalls():
    # a timer that slept three times its deadline (the deadline reported right); the node stalled
    # for most of it, which the old judgement (all threads, the whole interval) subtracted
    for stall in (0.0, 600.0, 5000.0):
        with pytest.raises(AssertionError, match="without excuse"):
            _judge_timer(_Host(stall_limit_ms=300), _report(905, deadline_ms=300), 950, stall)


def test_a_wrong_deadline_fails_even_when_given_up_in_time():
    with pytest.raises(AssertionError, match="set its deadline 900.0 ms"):
        _judge_timer(_Host(stall_limit_ms=300), _report(400, deadline_ms=900), 450)


def test_a_give_up_before_its_own_deadline_fails():
    with pytest.raises(AssertionError, match="before its own deadline"):
        _judge_timer(_Host(stall_limit_ms=300), _report(310, deadline_ms=350), 330)


def test_reported_times_the_host_did_not_see_fail_unless_the_acting_thread_stalled():
    # reports 310 ms; the host saw 910 ms between its start and its give-up
    with pytest.raises(AssertionError, match="reported times are not true"):
        _judge_timer(_Host(stall_limit_ms=300), _report(310), 910, end_stall_ms=100)
    recorded = _judge_timer(_Host(stall_limit_ms=300), _report(310), 550, end_stall_ms=100)
    assert recorded["give_up_report_lag_over_stalls"].values == [140]
    with pytest.raises(AssertionError, match="not true"):  # 200 ms of its own lag past a 400 ms stall
        _judge_timer(_Host(stall_limit_ms=300), _report(310), 910, end_stall_ms=400)
    with pytest.raises(Inconclusive):  # true only less a stall over its limit
        _judge_timer(_Host(stall_limit_ms=300), _report(310), 700, end_stall_ms=400)
    with pytest.raises(AssertionError, match="not true"):  # real hosts: no excuse
        _judge_timer(_Host(), _report(310), 550, end_stall_ms=None)


def test_a_runtime_that_reports_no_times_is_judged_by_the_hosts_interval_without_excuse():
    assert TimerReport.of({"elapsed_ms": 300.0}) is None
    assert TimerReport.of({"started_ns": 1, "deadline_ns": 2, "gave_up_ns": True}) is None
    recorded = _judge_timer(_Host(stall_limit_ms=300), None, 420, end_stall_ms=5000)
    assert recorded["give_up_host_clock"].values == [420]
    with pytest.raises(AssertionError, match="judged whole, without excuse"):
        _judge_timer(_Host(stall_limit_ms=300), None, 653, end_stall_ms=5000)
