"""Fault injectors for emulated hosts: each one checks its target, injects, and verifies.

    faults = FaultInjector(vm)
    "aer-fatal" in faults.capabilities            # what this host can do
    rec = faults.aer_fatal("gpu0")                # FaultRecord, verified in the guest
    stall = faults.stall_queue("gpu1", resume_after_s=3)
    faults.restore_all()                          # undo what is still in effect

Every method resolves its target first (a slot name, or the QEMU id of a
device below a slot's port), checks that the host and the device have
the capability, injects through QMP/HMP (or, for lost configuration, through
the guest), then waits with a deadline until the guest shows the fault took
effect. It returns a `FaultRecord` with host monotonic timestamps
(`time.monotonic_ns()`): `requested_ns` just before the injecting command,
`injected_ns` when its reply came back, `verified_ns` when the check passed.

A bad target, a missing capability, a QEMU reply that is not success, or a
fault that does not show within its deadline raises `FaultError` naming the
fault and the target: trouble with the test bed, never a verdict on the
runtime. One module per fault family (hotplug, aer, queue and model, config,
reset); see docs/faults.md for what each fault does, how it is verified, the
measured timings and the limits.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import FaultError
from ..host_action import action, capabilities_served
from .aer import CORRECTABLE_ERRORS, FATAL_ERRORS, NONFATAL_ERRORS, AerFaults
from .base import (
    MODEL_CAPABILITIES,
    QUEUE_CAPABILITIES,
    FaultRecord,
    Target,
    profile_capabilities,
    slot_capabilities,
)
from .config import ConfigFaults
from .hotplug import HotplugFaults
from .queue import QueueFaults
from .reset import ResetFaults
from .stall import QueueStall

__all__ = [
    "ALL_CAPABILITIES", "CORRECTABLE_ERRORS", "FATAL_ERRORS", "MODEL_CAPABILITIES", "NONFATAL_ERRORS",
    "QUEUE_CAPABILITIES", "FaultError", "FaultInjector", "FaultRecord", "QueueStall", "Target",
    "profile_capabilities", "slot_capabilities",
]


class FaultInjector(HotplugFaults, AerFaults, QueueFaults, ConfigFaults, ResetFaults):
    """The faults an emulated host can suffer, each verified to have taken effect.

    Use as a context manager (or call restore_all()) to undo the faults still in
    effect: stalls resumed, throttles lifted, I/O errors cleared, lost
    configuration restored, models back on the bus with their own firmware and link.
    Hot-adds and removals stay. Each action is declared once; the families share no method
    names, so none overrides another. The queue actions (queue.py) say which code runs: a model
    slot's own knobs (model.py, the class QueueFaults builds on) or an nvme stand-in's NBD export.
    """

    def __enter__(self) -> FaultInjector:
        return self

    def __exit__(self, *exc) -> None:
        self.restore_all()

    @action()
    def restore_all(self) -> None:
        """Undo every fault of this injector still in effect; FaultError lists what failed."""
        for slot, stall in list(self._stalls.items()):
            stall.resume()
            del self._stalls[slot]
        undo: list[tuple[Callable[[str], object], str]] = [
            *((self.clear_io_errors, s) for s in sorted(self._erroring)),
            *((self.restore_queue_speed, s) for s in sorted(self._slowed)),
            *((self.restore_config, s) for s in sorted(self._lost_config)),
        ]
        problems = self.restore_model_faults()
        for undo_one, slot in undo:
            try:
                undo_one(slot)
            except FaultError as exc:
                problems.append(str(exc))
        if problems:
            raise FaultError("restoring faults failed: " + "; ".join(problems))


ALL_CAPABILITIES = capabilities_served(FaultInjector)  # what its actions declare
