"""Mutant unstable_fingerprint, breaks DISC-05: a device's fingerprint changes at every start.

Plausible bug: the fingerprint hashes something that belongs to the process, not the
device (a per-start salt, an enumeration counter, a kernel handle), so it is stable
while the runtime runs and different after a restart or reboot.
"""

from __future__ import annotations

import hashlib
import time

from hilconform.runtime import inventory

from .launch import launch


def apply() -> None:
    original = inventory._identity
    salt = f"{time.time_ns()}"

    def identity_with_start_salt(info) -> tuple[str, str]:
        basis, digest = original(info)
        return basis, hashlib.sha256(f"{digest}|{salt}".encode()).hexdigest()[:16]

    inventory._identity = identity_with_start_salt


if __name__ == "__main__":
    launch("unstable_fingerprint", apply)
