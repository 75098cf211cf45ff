"""Cold enumeration and batched change delivery (DISC-01..04, DISC-06).

Three roles, so that a storm is read as it arrives (DISC-04):
* the reader thread only reads changes, stamps them and filters them by the
  selector; it never describes a device;
* a small pool of handler threads calls ``on_change`` for each change at once
  (DISC-02's latency end point): changes of one device in order, devices in
  parallel, adds, removals and errors before a "look again" (bind, unbind, a
  plain change), and a pending "look again" absorbs the later ones of its
  device (one re-read shows them all);
* the delivery thread hands each closed batch to ``on_batch`` once all of its
  changes were handled, batches in order.

Batching: a batch opens with the first change read and closes ``window_s``
after that change was read (a fixed window, not a sliding one), so a storm
inside one window is one batch (DISC-04), i.e. one topology rebuild, however
many devices it brings, and a trickle cannot hold a batch open.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .inventory import DeviceGone, DeviceInfo, describe
from .own_resources import OwnResourcesShort
from .selector import Selector
from .sysfs import BDF_RE, Sysfs

ACTIONS = ("add", "remove", "change", "bind", "unbind")
_BDF_IN_PATH = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_IDLE_POLL_S = 0.25  # how often an idle watcher looks at its stop flag
HANDLER_THREADS = 2  # on_change callers: a device blocked in a reset does not hold the others
BATCH_HANDLING_WAIT_S = 10.0  # a batch waits this long at most for its changes to be handled
LOOK_AGAIN = ("bind", "unbind", "change")
DISCOVERY_NICE = -10  # reader and handlers (raise_priority)
MAX_DRAINED = 1024  # changes found waiting at a window's close that still join its batch
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


def raise_priority(nice: int = DISCOVERY_NICE) -> None:
    """Run the calling thread at a higher priority than udev's workers, where allowed (root).

    In a storm the node is busy probing drivers and running udev rules; a reader at the
    default priority gets a slice among them and reads a storm's changes hundreds of ms late.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError):
        log.debug("discovery thread runs at the default priority", exc_info=True)


def looks_again(change: PciChange) -> bool:
    """A change that asks only to read the device again (no add, removal or error report)."""
    return change.action in LOOK_AGAIN and not change.properties.get("ERROR_EVENT")


@dataclass
class _Handling:
    """One change waiting for (or in) a handler; ``done`` is set once on_change returned."""

    change: PciChange
    done: threading.Event = field(default_factory=threading.Event)


class ChangeHandlers:
    """Calls ``on_change`` on a few threads: per device in arrival order, devices in parallel.

    The next device served is the one whose oldest pending change is most urgent (adds,
    removals and errors before "look again" changes), then the one waiting longest. A
    "look again" change queued behind a not yet started one of the same device is merged
    into it. ``submit`` returns the handling whose ``done`` the batch waits for.
    """

    def __init__(self, on_change: Callable[[PciChange], None], threads: int, call: Callable):
        self._on_change = on_change
        self._call = call
        self._pending: dict[str, deque[_Handling]] = {}
        self._busy: set[str] = set()
        self._order = itertools.count()
        self._arrival: dict[str, int] = {}
        self._cond = threading.Condition()
        self._adds_open = 0  # adds submitted and not yet handled (wait_adds_handled)
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"pci-change-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, change: PciChange) -> _Handling:
        with self._cond:
            queue_ = self._pending.setdefault(change.bdf, deque())
            if looks_again(change) and queue_ and looks_again(queue_[-1].change):
                return queue_[-1]  # one re-read, not yet started, covers this change too
            handling = _Handling(change)
            queue_.append(handling)
            self._adds_open += change.action == "add"
            self._arrival.setdefault(change.bdf, next(self._order))
            self._cond.notify()
            return handling

    def _next(self) -> tuple[str, _Handling] | None:
        """The most urgent device's oldest change (lock held), or None."""
        ready = [bdf for bdf, q in self._pending.items() if q and bdf not in self._busy]
        if not ready:
            return None
        bdf = min(ready, key=lambda b: (looks_again(self._pending[b][0].change), self._arrival[b]))
        handling = self._pending[bdf].popleft()
        if not self._pending[bdf]:
            del self._pending[bdf]
            del self._arrival[bdf]
        self._busy.add(bdf)
        return bdf, handling

    def _serve(self) -> None:
        raise_priority()
        while True:
            with self._cond:
                while not self._stopping and (item := self._next()) is None:
                    self._cond.wait()
                if self._stopping:
                    return
            bdf, handling = item
            try:
                self._call(self._on_change, handling.change)
            finally:
                handling.done.set()
                with self._cond:
                    self._adds_open -= handling.change.action == "add"
                    self._busy.discard(bdf)
                    if bdf in self._pending:
                        self._arrival[bdf] = next(self._order)  # its next change queues anew
                    self._cond.notify_all()

    def wait_adds_handled(self, timeout_s: float) -> bool:
        """Wait until no add is waiting or being handled; False when timeout_s passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._adds_open == 0 or self._stopping, timeout_s)

    def stop(self, timeout_s: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)


class DiscoveryWatcher:
    """Enumerates selected devices and delivers their changes: each to ``on_change`` at once,
    batches to ``on_batch`` (module docstring).

    Filtering: changes of devices the selector rejects are dropped; a change
    the selector cannot judge because the device is gone (every "remove") is
    delivered. An exception in a callback is logged and the watcher goes on.
    With ``source=None`` a UdevChangeSource is opened at the first enumerate()
    or start().
    """

    def __init__(
        self,
        sysfs: Sysfs,
        selector: Selector,
        window_s: float,
        on_batch: Callable[[list[PciChange]], None],
        source: ChangeSource | None = None,
        on_change: Callable[[PciChange], None] | None = None,
        handler_threads: int = HANDLER_THREADS,
    ):
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, not {window_s}")
        if handler_threads < 1:
            raise ValueError(f"handler_threads must be >= 1, not {handler_threads}")
        self.sysfs = sysfs
        self.selector = selector
        self.window_s = window_s
        self.on_batch = on_batch
        self.on_change = on_change
        self.source = source
        self.handler_threads = handler_threads
        self.batches_delivered = 0
        self.callback_errors = 0
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._handlers: ChangeHandlers | None = None
        self._closed_batches: queue.Queue[list[tuple[PciChange, _Handling | None]] | None] = queue.Queue()

    def _open_source(self) -> ChangeSource:
        if self.source is None:
            self.source = UdevChangeSource()
        return self.source

    def selected(self, bdf: str) -> bool | None:
        """Whether the selector takes the device; None when it cannot tell (device gone, or
        the runtime lacks the fds to read its IDs)."""
        try:
            ids = [self.sysfs.attr(bdf, name) for name in ("vendor", "device", "class")]
        except OwnResourcesShort:
            return None
        try:
            vendor, device, klass = (int(v, 16) for v in ids)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return self.selector.matches(vendor, device, klass)

    def _selected_by_uevent(self, change: PciChange) -> bool | None:
        """The selector's verdict from the uevent's own PCI_ID and PCI_CLASS (no sysfs read on
        the reader's path), or None when the uevent lacks them (a child's change)."""
        props = change.properties
        if props.get("CHILD_SUBSYSTEM") or "PCI_ID" not in props or "PCI_CLASS" not in props:
            return None
        try:
            vendor, device = (int(v, 16) for v in props["PCI_ID"].split(":"))
            klass = int(props["PCI_CLASS"], 16)
        except ValueError:
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
        """Start the reader, the handlers and the batch delivery."""
        if self._threads:
            return
        self._open_source()
        self._stop.clear()
        if self.on_change is not None:
            self._handlers = ChangeHandlers(self.on_change, self.handler_threads, self._call)
        for name, target in (("pci-discovery", self._read_changes), ("pci-batches", self._deliver_batches)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the threads (a batch being collected is delivered first) and close the source."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = []
        if self._handlers is not None:
            self._handlers.stop(timeout_s)
            self._handlers = None
        if self.source is not None:
            self.source.close()

    def wait_adds_handled(self, timeout_s: float) -> bool:
        """Wait until every add read so far was handled (its ``on_change`` returned).

        A storm's self-checks wait for it, so that describing the storm's later devices
        does not compete with checking its earlier ones (DISC-04: each within the
        hot-add budget). True at once when no handlers run (cold discovery).
        """
        handlers = self._handlers
        return True if handlers is None else handlers.wait_adds_handled(timeout_s)

    def _wants(self, change: PciChange) -> bool:
        if change.action == "remove" and not change.properties.get("CHILD_SUBSYSTEM"):
            wanted = change.bdf in self._known or self.selected(change.bdf) is not False
            self._known.discard(change.bdf)
            return wanted
        if change.bdf in self._known:
            return True
        verdict = self._selected_by_uevent(change)
        if verdict is None:
            verdict = self.selected(change.bdf)
        if verdict:
            self._known.add(change.bdf)
        return verdict is not False

    def _read(self, timeout_s: float) -> tuple[PciChange, _Handling | None] | None:
        """The next wanted change, already handed to the handlers; None when none came."""
        try:
            change = self.source.next(timeout_s)
        except Exception:  # noqa: BLE001 - a broken source must not kill discovery silently
            log.exception("change source failed")
            self._stop.wait(min(timeout_s, _IDLE_POLL_S))
            return None
        if change is None or not self._wants(change):
            return None
        return change, (self._handlers.submit(change) if self._handlers else None)

    def _read_changes(self) -> None:
        """Reader thread: a batch holds the changes read within window_s of its first one, and
        those found waiting when the window closes: they arrived before the reader looked,
        however late a busy node let it run (at most MAX_DRAINED, so a flood cannot hold a
        batch open)."""
        raise_priority()
        window_ns = round(self.window_s * 1e9)
        try:
            while not self._stop.is_set():
                first = self._read(_IDLE_POLL_S)
                if first is None:
                    continue
                batch = [first]
                deadline_ns = first[0].received_ns + window_ns
                while (left_ns := deadline_ns - time.monotonic_ns()) > 0:
                    item = self._read(left_ns / 1e9)
                    if item is not None:
                        batch.append(item)
                for _ in range(MAX_DRAINED):
                    item = self._read(0.0)
                    if item is None:
                        break
                    batch.append(item)
                self._closed_batches.put(batch)
        finally:
            self._closed_batches.put(None)  # the delivery thread ends after the last batch

    def _deliver_batches(self) -> None:
        """Delivery thread: each closed batch, in order, once its changes were handled."""
        while (batch := self._closed_batches.get()) is not None:
            deadline = time.monotonic() + BATCH_HANDLING_WAIT_S
            for change, handling in batch:
                if handling is not None and not handling.done.wait(max(0.0, deadline - time.monotonic())):
                    log.warning("batch delivered while %s %s is being handled", change.action, change.bdf)
                    break
            self.batches_delivered += 1
            self._call(self.on_batch, [change for change, _ in batch])

    def _call(self, callback: Callable, arg) -> None:
        try:
            callback(arg)
        except Exception:  # noqa: BLE001 - the caller's bug must not stop discovery
            self.callback_errors += 1
            log.exception("discovery callback %r failed", callback)
