"""What the device-model integration tests share: one running VM per test module, and a fault
injector whose faults are undone after each test (a fault left in place would leak into the
next test on the same VM).

The module's VM is restored from the run's saved VM of its configuration where there is one
(emulators/vm_snapshot.py: a restored VM is the VM a boot gives, test_fresh_host_restore.py):
the a100 modules here share one boot per run instead of one each (~8 s each under TCG)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hilconform.emulators import vm_snapshot
from hilconform.emulators.faults import FaultInjector
from hilconform.emulators.profile import HostProfile, load_profile
from hilconform.emulators.vm import EmulatedVM


@contextlib.contextmanager
def own_vm(profile: str | HostProfile) -> Iterator[EmulatedVM]:
    """A VM of `profile` for the block, restored or booted (the first of its configuration)."""
    machine = vm_snapshot.start_bare_vm(EmulatedVM(load_profile(profile) if isinstance(profile, str)
                                                      else profile))
    try:
        yield machine
    finally:
        machine.stop()


def running_vm(profile: str | HostProfile) -> Iterator[EmulatedVM]:
    """For a module-scoped fixture: `yield from running_vm("a100")`."""
    with own_vm(profile) as machine:
        yield machine


def restoring_faults(vm: EmulatedVM) -> Iterator[FaultInjector]:
    """For a per-test fixture: a FaultInjector on a live `vm`, restore_all() after the test."""
    vm.check_alive()
    injector = FaultInjector(vm)
    yield injector
    injector.restore_all()
