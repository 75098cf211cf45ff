"""DP-08 kubelet restart: when the kubelet restarts (the stand-in removes every socket in the
plugin directory and serves a new kubelet.sock, as the kubelet does), the plugin registers again
within `dp_reregister_ms` and advertises the same IDs, without being restarted itself.

Measured on the node's clock: the stand-in's `kubelet_start` record of the restart to the first
ListAndWatch message of the new registration that lists the IDs the plugin had before (a plugin
may list in several messages: a partial one first is no failure of itself, only the time to the
whole set counts), RESTARTS times (every one judged: max).
"""

from __future__ import annotations

import pytest
from dp_support import (
    advertised,
    answer_window_s,
    budget,
    fresh_host,
    kubelet_with_plugin,
    listed_healthy,
    ms_after,
    wait_list,
)

pytestmark = [pytest.mark.clause("DP-08"), pytest.mark.needs("kubelet-stand-in")]

RESTARTS = 3


def test_plugin_registers_again_after_a_kubelet_restart(host_factory, measurements, device_plugin):
    host = fresh_host(host_factory, device_plugin, None)  # the kubelet's restarts stay with this host
    limit = budget(host, "dp_reregister_ms")
    figures = []
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        before = {name: sorted(advertised(r)) for name, r in listed_healthy(kubelet, plugin).items()}
        pid = host.runtime_pid()
        for _ in range(RESTARTS):
            mark = kubelet.last_seq()
            kubelet.restart_kubelet()
            restarted = kubelet.wait_record("kubelet restart", lambda r: r["kind"] == "kubelet_start",
                                            mark, 30)
            for resource in plugin.resources:  # a plugin may list in several messages: the one
                # with the IDs it had is the answer (a partial first one is no failure of itself)
                try:
                    again = wait_list(kubelet, resource.name, restarted["seq"],
                                      lambda devices, ids=before[resource.name]: sorted(devices) == ids,
                                      answer_window_s(limit), f"the IDs it had ({before[resource.name]})")
                except AssertionError:
                    lists = [sorted(advertised(r)) for r in kubelet.records(restarted["seq"])
                             if r["kind"] == "list_and_watch" and r["resource"] == resource.name]
                    raise AssertionError(
                        f"{resource.name}: after the kubelet restart the plugin listed {lists or 'nothing'}; "
                        f"before it, {before[resource.name]}") from None
                figures.append(ms_after(again, restarted["ts_ns"]))
        assert host.runtime_pid() == pid, "the plugin was restarted, not re-registered"
    summary = measurements.record("DP-08", "reregister", figures, "ms", budget=limit, budget_stat="max")
    assert summary.within_budget, summary.text()
