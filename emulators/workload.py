"""In-flight work on a slot's queue device, driven from the host through the guest agent.

A drain needs something to drain and a stall needs something to stall: this
module starts direct reads (`dd iflag=direct`) on the block device of a slot's
nvme in the guest, without waiting for them (`guest-exec`), and lets the
caller see whether they still run, wait for them, or stop them.

    work = Workload(vm)
    job = work.start_reads("gpu1")          # keeps reading until stopped
    ...                                     # stall, remove, reset ...
    job.stop()                              # SIGKILL in the guest, wait for the exit

A job on a stalled queue sits in uninterruptible I/O wait: it cannot die
until the backend answers, so `stop()` on it times out (WaitTimeout says so).

The guest-side helpers (`block_device`, `io_stats`, `read_blocks`) are used by
the fault injectors too.
"""

from __future__ import annotations

import base64
import re
import shlex
import time
from dataclasses import dataclass

from .errors import FaultError, GuestAgentError, WaitTimeout
from .pci_inventory import BDF, PciFunction, function_below, query_pci
from .waiting import poll_until

POLL_S = 0.05


# -- the guest's view of a slot's queue device ---------------------------------------------------

def slot_device(vm, slot_name: str) -> PciFunction | None:
    """The function in a slot as QEMU places it (None when the slot is empty)."""
    slot = vm.profile.slot(slot_name)
    functions = query_pci(vm.qmp)
    bdf = function_below(functions, slot.port_id)
    return next((f for f in functions if f.bdf == bdf), None)


def block_device(agent, bdf: str, timeout_s: float = 10.0) -> str:
    """`/dev/nvmeXnY` of the nvme at `bdf` in the guest, waiting (deadline) for it to appear."""
    if not BDF.fullmatch(bdf):
        raise ValueError(f"not a PCI address: {bdf!r}")
    pattern = f"/sys/bus/pci/devices/{bdf}/nvme/nvme*/nvme*n*"
    found = poll_until(lambda: agent.shell(f"ls -d {pattern} 2>/dev/null", timeout_s=10).stdout.split(),
                       timeout_s, f"an nvme block device under {bdf} in the guest", every_s=0.1)
    return "/dev/" + sorted(found)[0].rsplit("/", 1)[1]


@dataclass(frozen=True)
class IoStats:
    """From /sys/block/<dev>/stat: completed requests and requests in flight."""

    reads_completed: int
    writes_completed: int
    in_flight: int


def parse_block_stat(text: str) -> IoStats:
    fields = [int(v) for v in text.split()]
    if len(fields) < 11:
        raise ValueError(f"not a /sys/block/*/stat line: {text!r}")
    return IoStats(reads_completed=fields[0], writes_completed=fields[4], in_flight=fields[8])


def io_stats(agent, device: str) -> IoStats:
    name = device.rsplit("/", 1)[-1]
    return parse_block_stat(agent.read_file(f"/sys/block/{name}/stat").decode())


DD_SECONDS = re.compile(r"copied, ([0-9.]+(?:e-?[0-9]+)?) s")


@dataclass(frozen=True)
class ReadResult:
    """One synchronous read in the guest: its exit, stderr and dd's own timing."""

    exit_code: int
    stderr: str
    guest_seconds: float | None  # as dd measured it inside the guest (None if it failed)
    host_seconds: float  # guest-agent round trip, host monotonic

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def read_blocks(agent, device: str, count: int = 1, skip: int = 0, block_size: int = 4096,
                direct: bool = True, timeout_s: float = 30.0) -> ReadResult:
    """Read `count` blocks with dd in the guest and wait for it (deadline timeout_s)."""
    argv = _dd_argv(device, count, skip, block_size, direct, quiet=False)
    started = time.monotonic()
    result = agent.run(["env", "LC_ALL=C", *argv], timeout_s=timeout_s)
    host_seconds = time.monotonic() - started
    match = DD_SECONDS.search(result.stderr)
    seconds = float(match.group(1)) if match and result.exit_code == 0 else None
    return ReadResult(result.exit_code, result.stderr.strip(), seconds, host_seconds)


def _dd_argv(device: str, count: int | None, skip: int, block_size: int, direct: bool,
             quiet: bool = True) -> list[str]:
    argv = ["dd", f"if={device}", "of=/dev/null", f"bs={block_size}", f"skip={skip}"]
    if count is not None:
        argv.append(f"count={count}")
    if direct:
        argv.append("iflag=direct")
    if quiet:
        argv.append("status=none")
    return argv


# -- background jobs -----------------------------------------------------------------------------

def _decode(b64: str | None) -> str:
    return base64.b64decode(b64).decode(errors="replace") if b64 else ""


@dataclass(frozen=True)
class JobResult:
    exit_code: int | None  # None when a signal ended it
    signal: int | None
    stderr: str
    seen_ended_ns: int  # host monotonic time at which a poll first saw the job ended

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ReadJob:
    """A read job running in the guest (its own session there, so stop() ends all of it)."""

    def __init__(self, agent, slot: str, device: str, argv: list[str], pid: int, started_ns: int):
        self.agent = agent
        self.slot = slot
        self.device = device
        self.argv = argv
        self.pid = pid
        self.started_ns = started_ns
        self.result: JobResult | None = None

    def __repr__(self) -> str:
        state = "running" if self.result is None else f"ended {self.result}"
        return f"ReadJob({self.slot} {self.device} pid {self.pid}, {state})"

    def poll(self) -> JobResult | None:
        """The job's result if it has ended, else None (asks the guest agent once)."""
        if self.result is None:
            status = self.agent.call("guest-exec-status", {"pid": self.pid})
            if status.get("exited"):
                self.result = JobResult(
                    exit_code=status.get("exitcode"),
                    signal=status.get("signal"),
                    stderr=_decode(status.get("err-data")).strip(),
                    seen_ended_ns=time.monotonic_ns(),
                )
        return self.result

    @property
    def running(self) -> bool:
        return self.poll() is None

    def wait(self, timeout_s: float) -> JobResult:
        deadline = time.monotonic() + timeout_s
        while (result := self.poll()) is None:
            if time.monotonic() > deadline:
                raise WaitTimeout(
                    f"read job on {self.slot} ({self.device}, guest pid {self.pid}) still running "
                    f"after {timeout_s:.1f}s")
            time.sleep(POLL_S)
        return result

    def stop(self, timeout_s: float = 10.0) -> JobResult:
        """SIGKILL the job's session in the guest and wait for it to end.

        A job stuck on a stalled queue cannot end until the backend resumes: then
        this raises WaitTimeout after timeout_s (the kill stays pending).
        """
        if self.poll() is not None:
            return self.result
        self.agent.run(["kill", "-KILL", "--", f"-{self.pid}"], timeout_s=10)
        try:
            return self.wait(timeout_s)
        except WaitTimeout:
            raise WaitTimeout(
                f"read job on {self.slot} ({self.device}, guest pid {self.pid}) did not end within "
                f"{timeout_s:.1f}s of SIGKILL: it is in uninterruptible I/O wait (is the queue "
                f"stalled?)") from None


class Workload:
    """Starts and tracks read jobs on the queue devices of a VM's slots."""

    def __init__(self, vm):
        self.vm = vm
        self.jobs: list[ReadJob] = []

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def has_block_device(self, slot: str) -> bool:
        """Whether the unit `slot` holds is a queue device with a guest block device to read."""
        device = slot_device(self.vm, slot)
        return device is not None and device.ids in self._queued_ids()

    def _queued_ids(self) -> set[str]:
        return {f"{k.vendor}:{k.device}" for k in self.vm.profile.kinds.values() if k.queue == "nbd"}

    def block_device(self, slot: str, timeout_s: float = 10.0) -> str:
        """The guest block device (`/dev/nvmeXnY`) of the queue device in `slot`."""
        if slot not in {s.name for s in self.vm.profile.slots}:
            known = ", ".join(s.name for s in self.vm.profile.slots)
            raise FaultError(f"workload: no slot {slot!r} on this host (slots: {known})")
        device = slot_device(self.vm, slot)
        if device is None:
            raise FaultError(f"workload: slot {slot} is empty")
        queued = self._queued_ids()
        if device.ids not in queued:
            raise FaultError(f"workload: slot {slot} holds {device.ids}, which has no block device "
                             f"(reads need a queue device: {', '.join(sorted(queued))})")
        try:
            return block_device(self.vm.agent, device.bdf, timeout_s)
        except WaitTimeout as exc:
            raise FaultError(f"workload: slot {slot} ({device.bdf}) has no block device: {exc}") from None

    def start_reads(self, slot: str, count: int | None = None, block_size: int = 4096,
                    direct: bool = True, skip: int = 0) -> ReadJob:
        """Start reading the slot's device in the background and return at once.

        count=None reads the whole device over and over until stopped; a number
        reads that many blocks once (dd stops early at the end of the device).
        """
        device = self.block_device(slot)
        dd = _dd_argv(device, count, skip, block_size, direct)
        if count is None:
            loop = f"while :; do {shlex.join(dd)} || exit $?; done"
            argv = ["setsid", "sh", "-c", loop]
        else:
            argv = ["setsid", *dd]
        pid = self.vm.agent.call(
            "guest-exec", {"path": argv[0], "arg": argv[1:], "capture-output": True})["pid"]
        job = ReadJob(self.vm.agent, slot, device, argv, pid, time.monotonic_ns())
        self.jobs.append(job)
        return job

    def running(self) -> list[ReadJob]:
        return [job for job in self.jobs if job.running]

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Stop every job still running; raise WaitTimeout naming those that would not end."""
        stuck = []
        for job in self.jobs:
            try:
                job.stop(timeout_s)
            except (WaitTimeout, GuestAgentError) as exc:
                stuck.append(str(exc))
        if stuck:
            raise WaitTimeout("; ".join(stuck))
