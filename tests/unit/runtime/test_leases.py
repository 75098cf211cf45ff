"""Lease table (LIFE-03/04): never two holders, expiry after the TTL, renewal keeps a lease."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hilconform.runtime.leases import LeaseError, LeaseTable

S = 1_000_000_000


def test_grant_renew_release():
    table = LeaseTable(default_ttl_s=30)
    lease = table.grant("job-1", ["A", "B"], now_ns=0)
    assert lease.expires_ns == 30 * S
    assert table.holder_of("A") is lease and table.holder_of("B") is lease
    table.renew(lease.id, now_ns=20 * S)
    assert lease.expires_ns == 50 * S and lease.renewals == 1
    assert table.expired(now_ns=49 * S) == []
    table.release(lease.id)
    assert table.holder_of("A") is None
    with pytest.raises(LeaseError) as err:
        table.renew(lease.id, now_ns=0)
    assert err.value.code == "UNKNOWN_LEASE"


def test_never_two_holders():
    table = LeaseTable(default_ttl_s=30)
    table.grant("one", ["A"], now_ns=0)
    with pytest.raises(LeaseError) as err:
        table.grant("two", ["B", "A"], now_ns=0)
    assert err.value.code == "DEVICE_BUSY"
    assert table.holder_of("B") is None  # nothing half-granted


def test_expiry_with_short_ttl():
    table = LeaseTable(default_ttl_s=30)
    short = table.grant("a", ["A"], now_ns=0, ttl_s=0.2)
    kept = table.grant("b", ["B"], now_ns=0, ttl_s=0.2)
    table.renew(kept.id, now_ns=int(0.15 * S))
    gone = table.expired(now_ns=int(0.25 * S))
    assert [lease.id for lease in gone] == [short.id]
    assert table.holder_of("A") is None and table.holder_of("B") is kept


def test_revoke_one_device_keeps_the_rest():
    table = LeaseTable(default_ttl_s=30)
    lease = table.grant("a", ["A", "B"], now_ns=0)
    assert table.revoke_device("A") is lease
    assert lease.devices == ["B"] and lease.revoked == ["A"]
    table.revoke_device("B")
    with pytest.raises(LeaseError):
        table.get(lease.id)


@pytest.mark.parametrize("ttl", [0, -1, 10**9])
def test_bad_ttl_refused(ttl):
    with pytest.raises(LeaseError) as err:
        LeaseTable(default_ttl_s=30).grant("a", ["A"], now_ns=0, ttl_s=ttl)
    assert err.value.code == "INVALID_PARAMS"


ops = st.lists(
    st.tuples(
        st.sampled_from(["grant", "renew", "release", "revoke", "tick"]),
        st.lists(st.sampled_from("ABCD"), min_size=1, max_size=3, unique=True),
        st.integers(0, 5),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_operations_keep_the_invariants(sequence):
    table = LeaseTable(default_ttl_s=1)
    now = 0
    for op, devices, k in sequence:
        now += k * S // 4
        leases = table.all()
        try:
            if op == "grant":
                table.grant("h", devices, now)
            elif op == "renew" and leases:
                table.renew(leases[k % len(leases)].id, now)
            elif op == "release" and leases:
                table.release(leases[k % len(leases)].id)
            elif op == "revoke":
                table.revoke_device(devices[0])
            else:
                for lease in table.expired(now):
                    assert lease.expires_ns <= now
        except LeaseError as exc:
            assert exc.code == "DEVICE_BUSY"
        table.check_invariants()
