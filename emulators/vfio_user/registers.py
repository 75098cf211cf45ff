"""BAR0 of a model: identity and version registers and a command queue with a doorbell.

The queue needs no thread: each submitted command is due `service_us` after
the one before it (or after its submission), and completions are counted
whenever a register is read. A stuck queue completes nothing while every
register keeps answering; a slow queue stretches the service time. The layout
is data (emulators/models/registers.toml).
"""

from __future__ import annotations

import collections
import time
import tomllib
from dataclasses import dataclass, field
from functools import cache

from .model import MODEL_DIR, DeviceModel

MASK32 = 0xFFFFFFFF


@cache
def register_map() -> dict[str, int]:
    return tomllib.loads((MODEL_DIR / "registers.toml").read_text())


@dataclass
class QueueCounters:
    tail: int = 0
    head: int = 0
    completions: int = 0
    rejected: int = 0


@dataclass
class HoldLog:
    """The model's own record of one stall, from the moment it stuck the queue: what the guest's
    reads of the queue found while the commands were held and after they were let go.

    Why: HP-02 judges a drain against it. Where the model holds a read in flight until the
    guest looks (`answer_after_next_look`), "the read was in flight when the drain looked" is
    the model's guarantee, not a guess from timings: a drain that reports its queue empty before
    any read of the queue found it empty reported done with work in flight, whatever it polled.
    Times are `clock()` seconds (time.monotonic: the host's CLOCK_MONOTONIC, the clock of the
    runtime client's `host_ns`)."""

    stuck_at: float
    in_flight_at_stall: int
    armed_at: float | None = None  # answer_after_next_look: from here the next look lets it go
    looks: list[tuple[float, int]] = field(default_factory=list)  # (when, value) in-flight reads
    answered_at: float | None = None  # the look that let the held commands go
    answered_in_flight: int | None = None  # what that look returned (still in flight)
    emptied_at: float | None = None  # the first read of the queue's state that found none in flight
    emptied_register: str | None = None  # which register that read was
    released_at: float | None = None  # unstuck by the host (resume), not by a look
    reset_at: float | None = None  # a queue reset dropped what was in flight

    MAX_LOOKS = 2000  # a drain polling every 5 ms for 300 ms looks ~60 times


class CommandQueue:
    """Commands in flight, completed in order when due (unless stuck)."""

    def __init__(self, depth: int, service_s: float, clock=time.monotonic):
        self.depth = depth
        self.service_s = service_s
        self.clock = clock
        self.stuck = False
        self.answer_on_look = False  # stuck until the next read of the in-flight count, then answers
        self.answered_at: float | None = None  # clock() when that read let the queue go
        self.hold_log: HoldLog | None = None  # the latest stall's record (HoldLog)
        self.counters = QueueCounters()
        self._due: collections.deque[float] = collections.deque()

    @property
    def in_flight(self) -> int:
        return len(self._due)

    def submit(self, count: int) -> None:
        self.advance()
        accepted = min(count, self.depth - len(self._due))
        self.counters.rejected += count - accepted
        now = self.clock()
        last = self._due[-1] if self._due else now
        for _ in range(accepted):
            last = max(last, now) + self.service_s
            self._due.append(last)
        self.counters.tail = (self.counters.tail + accepted) & MASK32

    def advance(self) -> None:
        """Complete every command that is due (none while stuck)."""
        if self.stuck:
            return
        now = self.clock()
        while self._due and self._due[0] <= now:
            self._due.popleft()
            self.counters.head = (self.counters.head + 1) & MASK32
            self.counters.completions = (self.counters.completions + 1) & MASK32

    def answer_after_next_look(self) -> None:
        """A stuck queue goes on answering once the in-flight count has been read once more:
        that read still sees the commands in flight. The precondition "a command in flight when
        the drain looks, answered while it polls" is then set by the drain's own first look,
        not by a delay that races it (HP-02, fixtures/preconditions.py)."""
        if self.stuck:
            self.answer_on_look = True
            self.answered_at = None
            if self.hold_log is not None:
                self.hold_log.armed_at = self.clock()

    def looked(self, value: int) -> None:
        """The in-flight count was read (after its value, `value`, was taken)."""
        log = self.hold_log
        if log is not None and log.emptied_at is None and len(log.looks) < HoldLog.MAX_LOOKS:
            log.looks.append((self.clock(), value))
        if self.stuck and self.answer_on_look:
            self.set_stuck(False, by_look=True)
            self.answered_at = self.clock()
            if log is not None:
                log.answered_at, log.answered_in_flight = self.answered_at, value

    def seen(self, register: str) -> None:
        """A register telling the queue's state was read (after advance()): the first such read
        that finds nothing in flight once the held commands were let go is when the guest could
        first know the queue empty."""
        log = self.hold_log
        if (log is not None and log.emptied_at is None and not self.stuck and not self._due
                and (log.answered_at is not None or log.released_at is not None)):
            log.emptied_at, log.emptied_register = self.clock(), register

    def set_stuck(self, stuck: bool, by_look: bool = False) -> None:
        self.answer_on_look = False
        if stuck:
            self.advance()
            self.stuck = True
            self.hold_log = HoldLog(self.clock(), len(self._due))
            return
        # Unstuck: what was waiting is due from now on, one service time apart.
        if self.stuck and not by_look and self.hold_log is not None and self.hold_log.released_at is None:
            self.hold_log.released_at = self.clock()
        self.stuck = False
        now = self.clock()
        pending = len(self._due)
        self._due.clear()
        for i in range(1, pending + 1):
            self._due.append(now + i * self.service_s)

    def set_service_time(self, service_s: float) -> None:
        self.advance()
        self.service_s = service_s
        now = self.clock()
        pending = len(self._due)
        self._due.clear()
        for i in range(1, pending + 1):
            self._due.append(now + i * service_s)

    def reset(self) -> None:
        """Drop every command in flight; head and tail back to 0 (completions keep counting)."""
        if self._due and self.hold_log is not None and self.hold_log.reset_at is None:
            self.hold_log.reset_at = self.clock()
        self._due.clear()
        self.counters.head = 0
        self.counters.tail = 0


class RegisterFile:
    """The BAR0 registers of one device instance."""

    def __init__(self, model: DeviceModel, queue: CommandQueue):
        self.model = model
        self.queue = queue
        self.regs = register_map()
        self.firmware_version = model.firmware.register
        self.shell_version = model.shell.register if model.shell else 0
        self.scratch = 0
        # reads that tell the guest whether commands are in flight (HoldLog.emptied_at)
        self._state_registers = {self.regs[n]: n
                                 for n in ("queue_in_flight", "queue_head", "queue_completions")}

    def read32(self, offset: int, first_byte: bool = True) -> int:
        """The register at `offset`. `first_byte`: the access reads the register's lowest byte (a
        whole read, or the first of a read the guest's CPU split byte by byte, as the kernel's
        copy of a mapped BAR may do): only such an access is a look at the queue (the guest's
        value of a count below 256 is in that byte; the later bytes are the same read's)."""
        r = self.regs
        self.queue.advance()
        c = self.queue.counters
        values = {
            r["magic"]: r["magic_value"],
            r["ident"]: self.model.vendor | self.model.device << 16,
            r["firmware_version"]: self.firmware_version,
            r["shell_version"]: self.shell_version,
            r["status"]: r["status_ready"],
            r["scratch"]: self.scratch,
            r["queue_depth"]: self.queue.depth,
            r["queue_tail"]: c.tail,
            r["queue_head"]: c.head,
            r["queue_completions"]: c.completions,
            r["queue_in_flight"]: self.queue.in_flight,
            r["queue_rejected"]: c.rejected,
        }
        if first_byte and offset in self._state_registers:
            self.queue.seen(self._state_registers[offset])
        if offset == r["queue_in_flight"] and first_byte:
            self.queue.looked(values[offset])
        return values.get(offset, 0)

    def write32(self, offset: int, value: int) -> None:
        r = self.regs
        if offset == r["scratch"]:
            self.scratch = value
        elif offset == r["queue_doorbell"]:
            self.queue.submit(value)
        elif offset == r["queue_control"] and value & r["queue_reset_bit"]:
            self.queue.reset()
        elif offset == r["shell_program"] and self.model.shell is not None:
            self.shell_version = value

    def read(self, offset: int, count: int) -> bytes:
        """Any aligned access inside the BAR: built from the 32-bit registers."""
        start = offset & ~3
        end = offset + count
        raw = bytearray()
        for at in range(start, end, 4):
            raw += self.read32(at, first_byte=at >= offset).to_bytes(4, "little")
        return bytes(raw[offset - start:offset - start + count])

    def write(self, offset: int, data: bytes) -> None:
        if offset % 4 == 0 and len(data) in (4, 8):
            for i in range(0, len(data), 4):
                self.write32(offset + i, int.from_bytes(data[i:i + 4], "little"))
        # Narrower writes hit no register: dropped, as the registers are 32-bit.
