"""DISC-05 on a real host: every device keeps its fingerprint across a runtime restart.

The runtime is restarted on the host (same config, same identity store); each
profile-selected device must be listed again under the same BDF with the same
fingerprint, and no `identity_changed` may be raised (nothing was swapped).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.clause("DISC-05"), pytest.mark.slow, pytest.mark.needs("real-host")]


def test_fingerprints_survive_a_runtime_restart_on_the_host(host):
    before = {d["device"]: d["fingerprint"] for d in host.settled_inventory()["devices"]}
    assert before, f"profile {host.profile.name} selects no device on the host"
    host.restart_runtime()
    runtime = host.runtime
    mark = runtime.mark()
    runtime.call("subscribe", {"since_seq": 0})
    records = host.settled_inventory()["devices"]
    after = {d["device"]: d["fingerprint"] for d in records}
    assert after == before, f"fingerprints before the restart {before}, after {after}"
    assert runtime.events(mark, "identity_changed") == []
    assert not any(d["identity_changed"] for d in records), records
    assert runtime.violations == []
