"""Bad input for `--host real:...`: each a clear error, exit status 2, nothing changed on the host.

Cases: an unreachable host, a refused SSH login, a host without python3, a
host whose python3 lacks pyudev, a profile that matches no device, an unknown
profile. The missing-python cases use keys with a forced command on the
stand-in guest's sshd that runs the session with a PATH hiding python3 (or a
python3 that cannot see pyudev), so the guest itself stays as built.
"""

from __future__ import annotations

import shlex

import pytest
from stand_in_real_host import (
    StandInHost,
    host_state,
    make_key,
    outcome,
    run_suites,
    write_ssh_config,
)

from hilconform.emulators.vm import free_loopback_port

BAD_INPUT_EXIT = 2
# Session PATHs for forced-command keys: one without python3, one whose python3 has no site-packages.
FAKE_PATHS = (
    "mkdir -p /tmp/hilc-nopython /tmp/hilc-nopyudev; ln -sf /bin/sh /tmp/hilc-nopython/sh; "
    "printf '#!/bin/sh\\nexec /usr/bin/python3 -S \"$@\"\\n' > /tmp/hilc-nopyudev/python3; "
    "chmod +x /tmp/hilc-nopyudev/python3"
)


def forced_key(stand_in: StandInHost, folder, name: str, path: str):
    """An ssh_config whose key the guest accepts only with PATH=`path` for the session."""
    key_dir = folder / name
    key_dir.mkdir()
    key = make_key(key_dir)
    public = (key_dir / "id_ed25519.pub").read_text().strip()
    forced = f'command="PATH={path} exec /bin/sh -c \\"$SSH_ORIGINAL_COMMAND\\"" {public}'
    done = stand_in.ssh(f"echo {shlex.quote(forced)} >> /root/.ssh/authorized_keys")
    assert done.returncode == 0, done.stderr
    return write_ssh_config(key_dir, key)


@pytest.fixture(scope="module")
def lacking(stand_in, tmp_path_factory):
    """ssh_configs for sessions lacking python3 / pyudev, made before the 'before' state is taken."""
    folder = tmp_path_factory.mktemp("forced-keys")
    assert stand_in.ssh(FAKE_PATHS).returncode == 0
    return {
        "python3": forced_key(stand_in, folder, "nopython", "/tmp/hilc-nopython"),
        "pyudev": forced_key(stand_in, folder, "nopyudev", "/tmp/hilc-nopyudev:/usr/bin:/bin"),
    }


def assert_bad_input(done, *words: str) -> None:
    text = done.stdout + done.stderr
    assert done.returncode == BAD_INPUT_EXIT, outcome(done)
    for word in words:
        assert word in text, f"expected {word!r} in the message:\n{outcome(done)}"
    assert "passed" not in done.stdout and "failed" not in done.stdout, outcome(done)


def test_unreachable_host(tmp_path):
    config = write_ssh_config(tmp_path, make_key(tmp_path))
    target = f"real:ssh://root@127.0.0.1:{free_loopback_port()}"
    done = run_suites(None, "suites/real", target=target, ssh_config=config)
    assert_bad_input(done, "unreachable", "Connection refused")


def test_every_refusal_is_clear_and_leaves_the_host_unchanged(stand_in, lacking, tmp_path):
    before = host_state(stand_in)
    stranger = write_ssh_config(tmp_path, make_key(tmp_path))
    assert_bad_input(run_suites(stand_in, "suites/real", ssh_config=stranger), "login", "refused")
    assert_bad_input(run_suites(stand_in, "suites/real", ssh_config=lacking["python3"]),
                     "python3 is not installed")
    assert_bad_input(run_suites(stand_in, "suites/real", ssh_config=lacking["pyudev"]),
                     "cannot import pyudev")
    assert_bad_input(run_suites(stand_in, "suites/real", profile="t4"),
                     "profile t4 selects 10de:1eb8", "has none of them")
    assert_bad_input(run_suites(stand_in, "suites/real", profile="no-such-gpu"),
                     "unknown real-host profile 'no-such-gpu'")
    assert host_state(stand_in) == before
