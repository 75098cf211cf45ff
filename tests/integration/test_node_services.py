"""A host started with node services hands them to the test: the kubelet stand-in that a DP
test's host starts on its node before the runtime (`HostFactory.start(kubelet_stand_in=True)`)
is taken over by `NodeKubelet.start`, with its journal from its first record, and never started
a second time beside it. On the host that boots or restores its configuration first and on a
restored one (fixtures/fresh_host.py starts the services there, then the runtime).

A second stand-in would still serve the test (the plugin registers with whichever serves
kubelet.sock), so no DP clause would notice it gone: only the cost would (a stand-in start is
~1.5-3 s under TCG, per DP test). Hence this test of its own.
"""

from __future__ import annotations

from hilconform.fixtures.kubelet_node import NodeKubelet


def test_the_stand_in_the_node_started_is_taken_over_not_started_again(host_factory, device_plugin,
                                                                      pytestconfig):
    made_by = []
    for _ in range(2):
        host = host_factory.start(runtime_overrides=device_plugin.boot_overrides, kubelet_stand_in=True)
        made_by.append(host.vm.made_by)
        kubelet = NodeKubelet(host)
        started_by_node = host.shell(f"cat {kubelet.PIDFILE}").check().stdout.strip()
        assert started_by_node.isdigit(), f"the node recorded no stand-in pid in {kubelet.PIDFILE}"
        kubelet.start()
        try:
            assert kubelet.pid == int(started_by_node), (
                f"a stand-in was started (pid {kubelet.pid}) beside the one the node started "
                f"({started_by_node}; host made by {host.vm.made_by})")
            running = host.shell("pgrep -f '[k]ubelet_stand_in' | wc -l").check().stdout.strip()
            assert running == "1", f"{running} stand-in processes on the node"
            first = kubelet.records()[0]
            assert first["seq"] == 1, f"the journal was not read from its first record: {first}"
        finally:
            kubelet.stop()
            host.close()
    if pytestconfig.getoption("--fresh-host") == "restore":
        assert made_by[1] == "restore", f"the second host was made by {made_by[1]}, not restored"
