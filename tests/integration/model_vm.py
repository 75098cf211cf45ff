"""What the device-model integration tests share: one running VM per test module, and a fault
injector whose faults are undone after each test (a fault left in place would leak into the
next test on the same VM)."""

from __future__ import annotations

from collections.abc import Iterator

from hilconform.emulators.faults import FaultInjector
from hilconform.emulators.profile import HostProfile, load_profile
from hilconform.emulators.vm import EmulatedVM


def running_vm(profile: str | HostProfile) -> Iterator[EmulatedVM]:
    """For a module-scoped fixture: `yield from running_vm("a100")`."""
    machine = EmulatedVM(load_profile(profile) if isinstance(profile, str) else profile).start()
    try:
        yield machine
    finally:
        machine.stop()


def restoring_faults(vm: EmulatedVM) -> Iterator[FaultInjector]:
    """For a per-test fixture: a FaultInjector on a live `vm`, restore_all() after the test."""
    vm.check_alive()
    injector = FaultInjector(vm)
    yield injector
    injector.restore_all()
