"""fixtures/allocation_checker.py: never two holders (LIFE-03), holders lose a device before it
disappears (HP-01 / HP-04), judged on a stream that may start late or have gaps."""

from __future__ import annotations

from hilconform.fixtures.allocation_checker import AllocationChecker


def lease(seq, lease_id, action, devices, **extra):
    return {"seq": seq, "event": "lease",
            "data": {"lease": lease_id, "action": action, "devices": devices, **extra}}


def removed(seq, device, cause):
    return {"seq": seq, "event": "removed", "data": {"device": device, "cause": cause}}


def test_a_device_granted_while_another_lease_holds_it_breaks_life03():
    checker = AllocationChecker()
    checker.feed_all([lease(1, "L1", "granted", ["d0", "d1"]), lease(2, "L2", "granted", ["d1"])])
    assert [c for c, _ in checker.violations] == ["LIFE-03"]
    assert "L1 still holds" in checker.violations[0][1]


def test_released_expired_and_revoked_devices_may_be_granted_again():
    checker = AllocationChecker()
    checker.feed_all([
        lease(1, "L1", "granted", ["d0"]), lease(2, "L1", "released", []),
        lease(3, "L2", "granted", ["d0", "d1"]), lease(4, "L2", "revoked", ["d1"], device="d0"),
        lease(5, "L3", "granted", ["d0"]), lease(6, "L3", "expired", []),
        lease(7, "L2", "renewed", ["d1"]), lease(8, "L4", "granted", ["d0"]),
    ])
    assert checker.violations == []


def test_a_held_device_removed_without_revocation_breaks_hp01_or_hp04_by_cause():
    checker = AllocationChecker()
    checker.feed_all([lease(1, "L1", "granted", ["d0", "d1"]), removed(2, "d0", "hot_remove"),
                      removed(3, "d1", "surprise")])
    assert [c for c, _ in checker.violations] == ["HP-01", "HP-04"]


def test_a_revoked_device_may_be_removed_and_an_unseen_lease_is_never_a_violation():
    checker = AllocationChecker()
    checker.feed_all([lease(1, "L1", "granted", ["d0"]), lease(2, "L1", "revoked", [], device="d0"),
                      removed(3, "d0", "hot_remove"), removed(4, "d9", "surprise"),
                      lease(5, "L7", "granted", ["d5"])])  # d5's earlier lease was never seen
    assert checker.violations == []


def test_a_gap_forgets_every_lease_and_a_replay_is_checked_once():
    checker = AllocationChecker()
    events = [lease(1, "L1", "granted", ["d0"]), lease(5, "L2", "granted", ["d0"])]  # 2..4 dropped
    checker.feed_all(events + events)
    assert checker.violations == [] and checker.gaps == [(2, 4)] and checker.checked == 2
