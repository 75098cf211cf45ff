"""Cold enumeration and batched change delivery (DISC-01..04, DISC-06).

Batching: a batch opens with the first change and closes ``window_s`` after
it (a fixed window, not a sliding one), so no change waits longer than
``window_s`` and a storm inside one window is one batch (DISC-04), i.e. one
topology rebuild. The add is DISC-02's latency end point: a caller that must
not wait for the window passes ``on_change``, called at once for each change.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .inventory import DeviceGone, DeviceInfo, describe
from .own_resources import Inconclusive
from .selector import Selector
from .sysfs import BDF_RE, Sysfs

ACTIONS = ("add", "remove", "change", "bind", "unbind")
_BDF_IN_PATH = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_IDLE_POLL_S = 0.25  # how often an idle watcher looks at its stop flag
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PciChange:
    """One change of a PCI function. ``received_ns``: time.monotonic_ns() when read.

    ``properties`` are the uevent's (ERROR_EVENT, DEVICE_ONLINE, DRIVER, ...).
    A change of a child class device (nvme controller) is reported on its PCI
    function as action "change" with CHILD_SUBSYSTEM/CHILD_ACTION/CHILD_NAME set.
    """

    action: str
    bdf: str
    received_ns: int
    properties: dict[str, str] = field(default_factory=dict)


class ChangeSource(Protocol):
    def next(self, timeout_s: float) -> PciChange | None:
        """The next change, or None when none arrived within timeout_s."""

    def close(self) -> None: ...


class QueueChangeSource:
    """A ChangeSource fed through ``put`` (tests, in-process injectors)."""

    def __init__(self):
        self._queue: queue.Queue[PciChange] = queue.Queue()
        self._closed = threading.Event()

    def put(self, change: PciChange) -> None:
        self._queue.put(change)

    def emit(self, action: str, bdf: str, **properties: str) -> PciChange:
        """Put a change stamped now; returns it."""
        change = PciChange(action, bdf, time.monotonic_ns(), dict(properties))
        self.put(change)
        return change

    def next(self, timeout_s: float) -> PciChange | None:
        if self._closed.is_set():
            return None
        try:
            return self._queue.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed.set()


class UdevChangeSource:
    """pyudev netlink monitor on subsystems "pci" and "nvme" (nvme mapped to its PCI function).

    It listens from construction on: create it BEFORE enumerating so that no
    add between enumeration and the watcher thread is lost. ``source`` is
    "udev" (after udev rules ran) or "kernel" (raw uevents, earlier, root only).
    """

    SUBSYSTEMS = ("pci", "nvme")

    def __init__(self, context=None, source: str = "udev", receive_buffer: int = 8 << 20):
        import pyudev  # lazily: unit tests and host-side tools run without it

        self._monitor = pyudev.Monitor.from_netlink(context or pyudev.Context(), source=source)
        for subsystem in self.SUBSYSTEMS:
            self._monitor.filter_by(subsystem)
        try:  # a storm must not overflow the socket while a batch is handled
            self._monitor.set_receive_buffer_size(receive_buffer)
        except Exception:  # noqa: BLE001 - needs CAP_NET_ADMIN; the default still works
            log.debug("could not enlarge the udev receive buffer", exc_info=True)
        self._monitor.start()

    def next(self, timeout_s: float) -> PciChange | None:
        device = self._monitor.poll(timeout=max(timeout_s, 0.0))
        if device is None:
            return None
        return change_from_uevent(
            device.action or "",
            device.subsystem or "",
            device.sys_name or "",
            device.device_path or "",
            dict(device.properties),
            time.monotonic_ns(),
        )

    def close(self) -> None:
        # pyudev monitors have no close(); dropping the socket is enough
        self._monitor = None


def change_from_uevent(
    action: str, subsystem: str, name: str, devpath: str, properties: dict, received_ns: int
) -> PciChange | None:
    """Map one uevent to a PciChange (None when it concerns no PCI function)."""
    props = {str(k): str(v) for k, v in properties.items()}
    if subsystem == "pci" and BDF_RE.match(name):
        return PciChange(action, name, received_ns, props)
    parents = _BDF_IN_PATH.findall(devpath)
    if not parents:
        return None
    props.update(CHILD_SUBSYSTEM=subsystem, CHILD_ACTION=action, CHILD_NAME=name)
    return PciChange("change", parents[-1], received_ns, props)


class DiscoveryWatcher:
    """Enumerates selected devices and delivers their changes to ``on_batch`` in batches.

    Filtering: changes of devices the selector rejects are dropped; a change
    the selector cannot judge because the device is gone (every "remove") is
    delivered. ``on_batch`` and ``on_change`` run on the watcher thread; an
    exception there is logged and the watcher goes on. With ``source=None``
    a UdevChangeSource is opened at the first enumerate() or start().
    """

    def __init__(
        self,
        sysfs: Sysfs,
        selector: Selector,
        window_s: float,
        on_batch: Callable[[list[PciChange]], None],
        source: ChangeSource | None = None,
        on_change: Callable[[PciChange], None] | None = None,
    ):
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, not {window_s}")
        self.sysfs = sysfs
        self.selector = selector
        self.window_s = window_s
        self.on_batch = on_batch
        self.on_change = on_change
        self.source = source
        self.batches_delivered = 0
        self.callback_errors = 0
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open_source(self) -> ChangeSource:
        if self.source is None:
            self.source = UdevChangeSource()
        return self.source

    def selected(self, bdf: str) -> bool | None:
        """Whether the selector takes the device; None when it cannot tell (device gone, or
        the runtime lacks the fds to read its IDs)."""
        try:
            ids = [self.sysfs.attr(bdf, name) for name in ("vendor", "device", "class")]
        except Inconclusive:
            return None
        try:
            vendor, device, klass = (int(v, 16) for v in ids)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return self.selector.matches(vendor, device, klass)

    def enumerate(self) -> list[DeviceInfo]:
        """Inventory of the selected devices present now (cold discovery)."""
        self._open_source()
        infos = []
        for bdf in self.sysfs.pci_addresses():
            if not self.selected(bdf):
                continue
            try:
                infos.append(describe(self.sysfs, bdf))
            except DeviceGone:
                continue
        self._known = {info.bdf for info in infos}
        return infos

    def start(self) -> None:
        """Start the batching thread."""
        if self._thread is not None:
            return
        self._open_source()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pci-discovery", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (a batch being collected is delivered first) and close the source."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.source is not None:
            self.source.close()

    def _wants(self, change: PciChange) -> bool:
        if change.action == "remove" and not change.properties.get("CHILD_SUBSYSTEM"):
            wanted = change.bdf in self._known or self.selected(change.bdf) is not False
            self._known.discard(change.bdf)
            return wanted
        if change.bdf in self._known:
            return True
        verdict = self.selected(change.bdf)
        if verdict:
            self._known.add(change.bdf)
        return verdict is not False

    def _read(self, timeout_s: float) -> PciChange | None:
        try:
            change = self.source.next(timeout_s)
        except Exception:  # noqa: BLE001 - a broken source must not kill discovery silently
            log.exception("change source failed")
            self._stop.wait(min(timeout_s, _IDLE_POLL_S))
            return None
        if change is None or not self._wants(change):
            return None
        if self.on_change is not None:
            self._call(self.on_change, change)
        return change

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self._read(_IDLE_POLL_S)
            if first is None:
                continue
            batch = [first]
            deadline = time.monotonic() + self.window_s
            while (left := deadline - time.monotonic()) > 0:
                change = self._read(left)
                if change is not None:
                    batch.append(change)
            self.batches_delivered += 1
            self._call(self.on_batch, batch)

    def _call(self, callback: Callable, arg) -> None:
        try:
            callback(arg)
        except Exception:  # noqa: BLE001 - the caller's bug must not stop discovery
            self.callback_errors += 1
            log.exception("discovery callback %r failed", callback)
