"""AER accounting (LIFE-05, AER-03): decayed weight, policy verdicts, counter deltas, kernel lines."""

from __future__ import annotations

import pytest

from hilconform.runtime.aer import AerPolicy, BurstFilter, CounterDeltas, DeviceAer, totals
from hilconform.runtime.kernel_log import parse_record

S = 1_000_000_000
POLICY = AerPolicy(half_life_s=2.0, degrade_weight=3.0, reset_weight=6.0, fault_weight=10.0)


def test_weight_halves_every_half_life():
    f = BurstFilter(half_life_s=2.0)
    f.add(8.0, 0)
    assert f.value(2 * S) == pytest.approx(4.0)
    assert f.value(6 * S) == pytest.approx(1.0)
    f.add(1.0, 6 * S)
    assert f.value(6 * S) == pytest.approx(2.0)


def test_short_burst_of_isolated_errors_does_not_reset():
    aer = DeviceAer(POLICY)
    for i in range(5):  # five errors within 50 ms, then quiet
        aer.record("nonfatal", 1, i * 10_000_000)
    assert not aer.verdict(50_000_000).reset
    assert aer.verdict(50_000_000).health == "DEGRADED"  # weight 5 >= degrade_weight 3
    assert not aer.verdict(10 * S).reset and aer.verdict(10 * S).health == "HEALTHY"  # faded


def test_sustained_rate_triggers_a_reset_then_faults():
    aer = DeviceAer(POLICY)
    now, first_reset = 0, None
    for i in range(40):  # 2 errors/s: steady state 2 * 2 / ln 2 ~ 5.8, plus fatal weight below
        now = i * S // 2
        aer.record("nonfatal", 1, now)
        verdict = aer.verdict(now)
        if verdict.reset and first_reset is None:
            first_reset = now
            aer.note_reset(now)
    assert first_reset is not None, "a sustained rate must ask for a reset"
    for _ in range(20):  # the rate doubles after the reset: past fault_weight
        now += S // 4
        aer.record("nonfatal", 1, now)
    verdict = aer.verdict(now)
    assert verdict.health == "FAULTED" and not verdict.reset


@pytest.mark.parametrize(("policy_state", "expected"), [("HEALTHY", "HEALTHY"), ("DEGRADED", "DEGRADED")])
def test_recovered_nonfatal_follows_policy(policy_state, expected):
    aer = DeviceAer(AerPolicy(nonfatal_recovered=policy_state))
    aer.begin_recovery(0)
    aer.record("nonfatal", 1, 0)
    severity, uncounted = aer.end_recovery(S)
    assert (severity, uncounted) == ("nonfatal", None)
    assert aer.verdict(S, recovered=severity).health == expected


def test_error_counted_just_before_the_recovery_belongs_to_it():
    aer = DeviceAer(POLICY)
    aer.record("fatal", 1, 0)  # the kernel log line made us read the counters first
    aer.begin_recovery(S // 2)
    assert aer.end_recovery(S) == ("fatal", None)
    assert aer.counts == {"correctable": 0, "nonfatal": 0, "fatal": 1}  # no extra error invented
    aer.record("nonfatal", 1, 30 * S)
    aer.begin_recovery(31 * S)
    assert aer.end_recovery(31 * S) == ("nonfatal", None)  # the old fatal one was explained already


def test_recovery_without_a_counted_error_counts_one():
    aer = DeviceAer(POLICY)
    aer.begin_recovery(0)
    assert aer.end_recovery(S) == ("nonfatal", "nonfatal")
    assert aer.counts["nonfatal"] == 1


def test_a_fatal_error_no_counter_showed_counts_once_from_the_kernel_line():
    """An endpoint's own fatal error grows no aer_dev_* counter (the kernel does not read its
    registers then): the kernel line's severity is the count."""
    aer = DeviceAer(POLICY)
    aer.begin_recovery(0, "fatal")
    assert aer.end_recovery(S) == ("fatal", "fatal")
    assert aer.counts == {"correctable": 0, "nonfatal": 0, "fatal": 1}


def test_the_kernel_line_adds_nothing_a_counter_showed():
    aer = DeviceAer(POLICY)
    aer.begin_recovery(0, "nonfatal")
    aer.record("fatal", 1, S // 2)  # the counters saw worse than the line said
    assert aer.end_recovery(S) == ("fatal", None)
    aer.begin_recovery(2 * S, "fatal")
    aer.record("fatal", 1, 2 * S)
    assert aer.end_recovery(3 * S) == ("fatal", None)
    assert aer.counts["fatal"] == 2 and aer.counts["nonfatal"] == 0


def test_a_line_read_after_udev_opened_the_window_names_its_severity():
    aer = DeviceAer(POLICY)
    aer.begin_recovery(0)  # udev's BEGIN_RECOVERY first
    aer.learn_severity("fatal")
    assert aer.end_recovery(S) == ("fatal", "fatal")


def test_fatal_episode_wins_and_clear_forgets_weight():
    aer = DeviceAer(POLICY)
    aer.begin_recovery(0)
    aer.record("nonfatal", 1, 0)
    aer.record("fatal", 1, 0)
    assert aer.end_recovery(0) == ("fatal", None)
    assert aer.verdict(0, recovered="fatal").health == "DEGRADED"
    aer.clear()
    assert aer.verdict(0).health == "HEALTHY"


def test_counter_deltas_and_totals():
    counters = {"nonfatal": {"DLP": 1, "TOTAL_ERR_NONFATAL": 2}, "fatal": {"DLP": 1}, "correctable": {}}
    assert totals(counters) == {"correctable": 0, "nonfatal": 2, "fatal": 1}
    deltas = CounterDeltas()
    assert deltas.delta("p", {"nonfatal": 2}) == {"correctable": 0, "nonfatal": 0, "fatal": 0}  # baseline
    assert deltas.delta("p", {"nonfatal": 5})["nonfatal"] == 3
    assert deltas.delta("p", {"nonfatal": 1})["nonfatal"] == 1  # counter restarted (reset)


def test_policy_from_config_merges_weights():
    policy = AerPolicy.from_config({"half_life_s": 1.0, "error_weight": {"fatal": 5.0}})
    assert policy.weights == {"correctable": 0.0, "nonfatal": 1.0, "fatal": 5.0}


@pytest.mark.parametrize(
    ("record", "kind", "fields"),
    [
        (
            "6,812,5012345,-;pcieport 0000:00:02.0: pciehp: Slot(1): Attention button pressed",
            "attention_button",
            {"port": "0000:00:02.0", "slot": "1", "kmsg_ts_us": 5012345},
        ),
        (
            "6,813,5012400,-;pcieport 0000:00:02.0: pciehp: Slot(1): Powering off due to button press\n"
            " SUBSYSTEM=pci\n DEVICE=+pci:0000:00:02.0",
            "button_power_off",
            {"slot": "1"},
        ),
        ("pcieport 0000:00:1c.0: pciehp: Slot(0-1): Button cancel", "button_cancel", {"slot": "0-1"}),
        (
            "[   12.345678] pcieport 0000:00:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0",
            "aer_error",
            {"bdf": "0000:01:00.0", "severity": "nonfatal"},
        ),
        (
            "pcieport 0000:00:02.0: AER: Multiple Uncorrected (Fatal) error message received from "
            "0000:00:02.0",
            "aer_error",
            {"bdf": "0000:00:02.0", "severity": "fatal"},
        ),
        (
            "pcieport 0000:00:02.0: AER: Corrected error received: 0000:01:00.0",
            "aer_error",
            {"severity": "correctable"},
        ),
        ("nvme 0000:01:00.0: AER: device recovery successful", "aer_recovered", {"port": "0000:01:00.0"}),
        ("pcieport 0000:00:02.0: AER: Root Port link has been reset", "link_reset", {}),
    ],
)
def test_kernel_lines(record, kind, fields):
    event = parse_record(record)
    assert event is not None and event.kind == kind
    for key, value in fields.items():
        assert getattr(event, key) == value


def test_unrelated_kernel_lines_ignored():
    assert parse_record("6,1,1,-;e1000e 0000:00:03.0 eth0: NIC Link is Up") is None
    assert parse_record("") is None
