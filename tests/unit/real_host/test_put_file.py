"""A real host gets a plugin of any size streamed over its runner (issue 33): never whole in
memory, with a deadline that grows with the size. Here the local runner; over SSH the same code
path (tests/vm/ runs it against an emulated guest's sshd)."""

from __future__ import annotations

import hashlib
import os

from hilconform.fixtures.remote_command import LocalRunner, put_file

SIZE = 64 << 20


def test_a_64_mib_file_is_streamed_whole(tmp_path):
    local = tmp_path / "plugin"
    with local.open("wb") as out:  # incompressible, so nothing in the path can shortcut it
        for _ in range(SIZE >> 20):
            out.write(os.urandom(1 << 20))
    remote = tmp_path / "node" / "plugin"
    remote.parent.mkdir()
    runner = LocalRunner()
    try:
        put_file(runner, local, str(remote))
    finally:
        runner.close()
    assert remote.stat().st_size == SIZE and os.access(remote, os.X_OK)
    assert hashlib.sha256(remote.read_bytes()).digest() == hashlib.sha256(local.read_bytes()).digest()
