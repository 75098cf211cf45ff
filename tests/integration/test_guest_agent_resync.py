"""The guest-agent channel cannot go out of step against a real guest (issue 33).

The case seen: a plugin copy pushed through `guest-exec` timed out, and the next calls read the
stale replies of earlier ones ("guest-get-time: Invalid parameter 'pid'"), so even the failing
test's evidence (dmesg, runtime log) could not be read. Here a call gives up on purpose before the
agent answers (a few MB of input, which the agent parses for seconds under TCG), and every call
after it must get its own reply. And a large file reaches the guest through the VM's share, never
through the agent, byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time

import pytest

from hilconform.emulators.errors import GuestAgentError


def test_the_calls_after_a_timed_out_call_get_their_own_replies(host):
    agent = host.vm.agent
    payload = os.urandom(6 << 20)
    with pytest.raises(GuestAgentError, match="no reply before the deadline"):
        agent.call("guest-exec", {"path": "/bin/true", "input-data": base64.b64encode(payload).decode()},
                   timeout_s=0.2)
    resyncs = agent.resyncs
    info = agent.call("guest-info", timeout_s=60)  # the agent may still be parsing the abandoned one
    assert "version" in info, info  # not the abandoned guest-exec's {"pid": ...}
    assert agent.resyncs == resyncs + 1
    started = time.monotonic()
    assert isinstance(agent.call("guest-get-time"), int)
    assert host.shell("echo in-step").check().stdout.strip() == "in-step"
    assert "Linux version" in host.shell("dmesg | head -1").check().stdout  # evidence still readable
    assert time.monotonic() - started < 30


def test_a_large_file_reaches_the_guest_through_the_share(host):
    vm = host.vm
    data = os.urandom(48 << 20)
    (vm.layout.guest_share / "device-plugin").mkdir(exist_ok=True)
    (vm.layout.guest_share / "device-plugin" / "big.bin").write_bytes(data)
    sha256 = hashlib.sha256(data).hexdigest()
    path = vm.share_file_in_guest("device-plugin/big.bin", sha256)  # checked in the guest
    assert path.startswith("/run/hilconform/share/")
    assert host.shell(f"stat -c %s {path}").check().stdout.strip() == str(len(data))
    with pytest.raises(Exception, match="not 0+"):
        vm.share_file_in_guest("device-plugin/big.bin", "0" * 64)
