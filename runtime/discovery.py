"""Cold enumeration and batched change delivery (DISC-01..04, DISC-06).

Batching: a batch opens with the first change and closes ``window_s`` after
it (a fixed window, not a sliding one), so an add is never delayed by more
than ``window_s`` (the add is DISC-02's latency end point) and a storm within
one window is one batch (DISC-04), i.e. one topology rebuild.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .inventory import DeviceInfo
from .selector import Selector
from .sysfs import Sysfs

ACTIONS = ("add", "remove", "change", "bind", "unbind")


@dataclass(frozen=True)
class PciChange:
    """One udev change of a PCI function; ``received_ns`` is time.monotonic_ns() when read."""

    action: str
    bdf: str
    received_ns: int
    properties: dict[str, str] = field(default_factory=dict)


class ChangeSource(Protocol):
    def next(self, timeout_s: float) -> PciChange | None:
        """The next change, or None when none arrived within timeout_s."""

    def close(self) -> None: ...


class QueueChangeSource:
    """A ChangeSource fed by tests (or by an in-process injector) through ``put``."""

    def put(self, change: PciChange) -> None:
        raise NotImplementedError

    def next(self, timeout_s: float) -> PciChange | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class UdevChangeSource:
    """pyudev monitor on subsystem "pci" (nvme/block changes mapped to their PCI parent).

    Create it (it starts listening) BEFORE ``enumerate()`` so no add is missed.
    """

    def __init__(self, context=None):
        raise NotImplementedError

    def next(self, timeout_s: float) -> PciChange | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class DiscoveryWatcher:
    """Enumerates selected devices and delivers changes to ``on_batch`` in batches."""

    def __init__(
        self,
        sysfs: Sysfs,
        selector: Selector,
        window_s: float,
        on_batch: Callable[[list[PciChange]], None],
        source: ChangeSource | None = None,
    ):
        raise NotImplementedError

    def enumerate(self) -> list[DeviceInfo]:
        """Inventory of the selected devices present now (cold discovery)."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the batching thread (creates a UdevChangeSource if none was given)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
