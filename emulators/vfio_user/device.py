"""One emulated card: configuration space, BAR0 registers, memfd BARs, resets and faults.

The server calls `region_read`/`region_write`; tests call the fault methods
directly (no signals, no helper process). Everything is under one lock
because the server thread and the test thread both touch the state.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field

from . import protocol
from .config_space import ConfigSpace
from .model import Bar, DeviceModel, Version, pci_tables
from .registers import CommandQueue, RegisterFile


@dataclass
class DeviceStats:
    region_reads: int = 0
    region_writes: int = 0
    device_resets: int = 0
    flrs: int = 0
    log: list[str] = field(default_factory=list)


class ModelDevice:
    def __init__(self, model: DeviceModel, instance: str, serial_number: int | None = None):
        self.model = model
        self.instance = instance
        self.lock = threading.RLock()
        self.stats = DeviceStats()
        self.config = ConfigSpace(model, serial_number, on_flr=self._flr)  # None: the model file's
        self.queue = CommandQueue(model.queue_depth, model.queue_service_us / 1e6)
        self.registers = RegisterFile(model, self.queue)
        self.fallen_off = False
        self.reset_ready_delay_s = 0.0  # knob: how long the card stays not ready after a reset
        self._not_ready_until = 0.0  # monotonic time until which every read returns all ones
        self.memfds: dict[int, int] = {}
        self._state_after_first_reset: dict | None = None  # load_state: a restored VM's card
        for bar in model.bars:
            if bar.backing == "memfd":
                fd = os.memfd_create(f"hilc-{instance}-bar{bar.index}", os.MFD_CLOEXEC)
                os.ftruncate(fd, bar.size)
                self.memfds[bar.index] = fd

    def close(self) -> None:
        for fd in self.memfds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.memfds.clear()

    # -- a saved VM (emulators/vm_snapshot.py) ------------------------------------------------------
    def saved_state(self) -> dict:
        """What this card holds that QEMU's migration stream does not: the guest's configuration
        writes, register values, queue counters and what the guest wrote into its memfd BARs
        (only the extents that hold data: a 256 MiB BAR the guest never touched costs nothing).
        A VM restored from the stream gets a new card loaded with this (`load_state`)."""
        if self.queue.in_flight or self.queue.stuck or self.fallen_off or self.resetting:
            raise ValueError(f"{self.instance}: a card with a fault or work in flight is not saved")
        with self.lock:
            return {
                "config": bytes(self.config.data),
                "registers": (self.registers.scratch, self.registers.firmware_version,
                              self.registers.shell_version),
                "queue": dataclasses.replace(self.queue.counters),
                "bars": {index: _data_extents(fd) for index, fd in self.memfds.items()},
            }

    def load_state(self, state: dict) -> None:
        """Take the state `saved_state` gave, before QEMU connects, and again after QEMU's first
        device reset: a QEMU starting to load a saved VM resets its devices first (machine
        reset), and the guest it then resumes expects the card as it was saved."""
        with self.lock:
            self._load(state)
            self._state_after_first_reset = state

    def _load(self, state: dict) -> None:
        with self.lock:
            self.config.data[:] = state["config"]
            (self.registers.scratch, self.registers.firmware_version,
             self.registers.shell_version) = state["registers"]
            self.queue.counters = dataclasses.replace(state["queue"])
            for index, extents in state["bars"].items():
                for offset, data in extents:
                    os.pwrite(self.memfds[index], data, offset)

    # -- what the server asks ---------------------------------------------------------------------
    def region_info(self, index: int) -> tuple[int, int, int | None]:
        """(flags, size, fd to map or None) of a vfio region."""
        rw = protocol.REGION_FLAG_READ | protocol.REGION_FLAG_WRITE
        if index == protocol.CONFIG_REGION:
            return rw, 4096, None
        bar = self.model.bar(index) if index in protocol.BAR_REGIONS else None
        if bar is None:
            return 0, 0, None
        if bar.backing == "memfd":
            return rw | protocol.REGION_FLAG_MMAP, bar.size, self.memfds[bar.index]
        return rw, bar.size, None

    def region_read(self, region: int, offset: int, count: int) -> bytes:
        with self.lock:
            self.stats.region_reads += 1
            if self.fallen_off or self.resetting:
                return b"\xff" * count
            if region == protocol.CONFIG_REGION:
                return self.config.read(offset, count)
            bar = self._bar(region, offset, count)
            if bar.backing == "registers":
                if not self.config.memory_decoding:
                    return b"\xff" * count  # memory space off (e.g. config lost): reads go unanswered
                return self.registers.read(offset, count)
            return os.pread(self.memfds[bar.index], count, offset)

    def region_write(self, region: int, offset: int, data: bytes) -> None:
        with self.lock:
            self.stats.region_writes += 1
            if self.fallen_off or self.resetting:
                return
            if region == protocol.CONFIG_REGION:
                self.config.write(offset, data)
                return
            bar = self._bar(region, offset, len(data))
            if bar.backing == "registers":
                if self.config.memory_decoding:
                    self.registers.write(offset, data)
            else:
                os.pwrite(self.memfds[bar.index], data, offset)

    def _bar(self, region: int, offset: int, count: int) -> Bar:
        bar = self.model.bar(region) if region in protocol.BAR_REGIONS else None
        if bar is None or offset < 0 or offset + count > bar.size:
            raise ValueError(f"{self.instance}: access to region {region} at 0x{offset:x}+{count} "
                             "is outside every BAR")
        return bar

    def device_reset(self) -> None:
        """VFIO device reset (QEMU resets the device on system reset / guest reboot)."""
        with self.lock:
            self.stats.device_resets += 1
            self.stats.log.append("device_reset")
            self._reset_function()
            if self._state_after_first_reset is not None:  # a restored VM's machine reset
                self._load(self._state_after_first_reset)
                self._state_after_first_reset = None

    def _flr(self) -> None:
        # Called from config.write with the lock held.
        self.stats.flrs += 1
        self.stats.log.append("flr")
        self._reset_function()

    @property
    def resetting(self) -> bool:
        """Still inside the not-ready window after a reset: reads return all ones (a config read
        that a real card would answer with a retry status), writes are dropped."""
        return time.monotonic() < self._not_ready_until

    def _reset_function(self) -> None:
        """What a reset clears: the queue, the guest's registers and config writes.

        The firmware version, a fault's link state and an FPGA's programmed shell stay:
        they belong to the card, not to the function's volatile state.
        """
        link = self.config.link_status()
        self.queue.reset()
        self.registers.scratch = 0
        self.config.reset()
        speeds = {code: name for name, code in pci_tables()["link_speeds"].items()}
        self.config.set_link(speeds[link[0]], link[1])
        if self.reset_ready_delay_s > 0:
            self._not_ready_until = time.monotonic() + self.reset_ready_delay_s

    # -- fault knobs --------------------------------------------------------------------------------
    def stick_queue(self, stuck: bool = True) -> None:
        """Completions stop (registers still answer); False lets them resume."""
        with self.lock:
            self.queue.set_stuck(stuck)

    def answer_queue_after_next_look(self) -> None:
        """A stuck queue answers right after the guest's next read of its in-flight count."""
        with self.lock:
            self.queue.answer_after_next_look()

    def slow_queue(self, service_s: float | None) -> None:
        """Each command takes service_s; None restores the model's own service time."""
        with self.lock:
            self.queue.set_service_time(
                self.model.queue_service_us / 1e6 if service_s is None else service_s)

    def fall_off_bus(self, fallen: bool = True) -> None:
        """Every config and register read returns all ones, writes vanish; no hot-plug event.

        BARs the guest has mapped (memfd) keep their contents, as with a server that died.
        """
        with self.lock:
            self.fallen_off = fallen

    def lose_config(self) -> None:
        """The card forgot its configuration: BAR addresses and command register cleared.

        QEMU's vfio-pci virtualises the BAR address registers, so the guest still reads the
        addresses it assigned; it sees the command register at 0 (memory decoding off) and
        BAR0 reads unanswered (all ones) until it restores the configuration.
        """
        with self.lock:
            self.config.clear_bars()

    def set_firmware_version(self, version: str | None) -> None:
        """Report another firmware version (a mismatch); None restores the model's."""
        with self.lock:
            chosen = self.model.firmware if version is None else Version.parse(version)
            self.registers.firmware_version = chosen.register

    def delay_reset_ready(self, seconds: float | None) -> None:
        """After each later FLR or device reset the card stays not ready for `seconds` (the
        kernel's reset then waits, polling config space: a reset that overruns its budget).
        None or 0 restores an immediate reset."""
        with self.lock:
            if seconds is not None and not 0 <= seconds <= 60:
                raise ValueError(f"reset-ready delay must be 0-60 s (the kernel waits 60 s at most), "
                                 f"not {seconds!r}")
            self.reset_ready_delay_s = float(seconds or 0.0)
            if not self.reset_ready_delay_s:
                self._not_ready_until = 0.0

    def train_link(self, speed: str | None = None, width: int | None = None) -> None:
        """Link Status as if trained at speed/width (below the capability); None = capability."""
        with self.lock:
            speed = speed or self.model.link_speed
            width = width or self.model.link_width
            if speed not in pci_tables()["link_speeds"]:
                raise ValueError(f"unknown link speed {speed!r}")
            self.config.set_link(speed, width)


def _data_extents(fd: int) -> list[tuple[int, bytes]]:
    """(offset, bytes) of each run of a memfd that holds data (SEEK_DATA / SEEK_HOLE)."""
    end = os.fstat(fd).st_size
    extents, offset = [], 0
    while offset < end:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after offset
            break
        stop = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, os.pread(fd, stop - start, start)))
        offset = stop
    return extents
