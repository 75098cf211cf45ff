"""Command-queue faults: stall/resume, slow queue, I/O errors, each declared here once.

A slot's queue is one of two kinds, and each action says which code runs: a device model's
command queue (its own knobs, ModelFaults in model.py) or an nvme stand-in's. The nvme's queue
device sits on throttle `q-<slot>` -> raw `q-<slot>-raw` -> nbd
`q-<slot>-nbd` -> the slot's qemu-nbd (emulators/qemu_command.py). A stall
stops qemu-nbd (SIGSTOP), a slow queue sets the slot's throttle-group limits,
I/O errors swap a blkdebug node in under the raw node (blockdev-reopen).
"""

from __future__ import annotations

import time

from ..errors import FaultError, WaitTimeout
from ..host_action import action
from ..qemu_command import queue_format_node, queue_nbd_node, queue_node, throttle_group
from ..workload import block_device, io_stats, read_blocks
from .base import FaultRecord
from .model import ModelFaults
from .stall import STALL_SAMPLE_GAP_S, STALL_TIMEOUT_S, QueueStall

SLOW_TIMING_MAX_IOPS = 20  # above this one request's wait is too short to time reliably
IO_TIMEOUT_S = 20.0
GUEST_READ_ERRORS = ("No data available", "Input/output error")  # ENODATA (nvme medium error), EIO


class QueueFaults(ModelFaults):
    @action("queue-stall", "queue-slow", "queue-error")
    def start_reads(self, target: str) -> bool:
        """Reads in flight on the slot's block device, over and over until the device goes or the
        host stops (work a removal or a stall then finds); False, and nothing started, where the
        unit has no block device of its own to read (a device model's queue is its registers)."""
        if not self.workload.has_block_device(target):
            return False
        self.workload.start_reads(target)
        return True

    @action("queue-stall")
    def stall_queue(self, target: str, resume_after_s: float | None = None, probe: bool = True,
                    timeout_s: float = STALL_TIMEOUT_S) -> QueueStall:
        """SIGSTOP the slot's qemu-nbd: requests in flight hang until resumed.

        Verified when the guest's block device has a request in flight and no
        completions over STALL_SAMPLE_GAP_S. With probe=True and nothing in
        flight, one direct 4 KiB read is issued (in the background) to be the
        stuck request. resume_after_s: resume automatically that long after this
        returns (the "hardware" answers then; see QueueStall). A device model's queue is stuck
        through its own knob instead (ModelFaults._stall_model_queue).
        """
        fault = "queue-stall"
        model = self._model_target(fault, target)
        if model is not None:
            return self._stall_model_queue(target, model, resume_after_s, probe, timeout_s)
        resolved, backend, device = self._queue_target(fault, target)
        if backend.stalled:
            raise FaultError(f"{fault} at {target}: the queue is already stalled")
        requested_ns = time.monotonic_ns()
        backend.stall()
        injected_ns = time.monotonic_ns()
        probe_job = None
        try:
            deadline = time.monotonic() + timeout_s
            probe_at = time.monotonic() + 2 * STALL_SAMPLE_GAP_S  # let running work get stuck first
            first = io_stats(self.vm.agent, device)
            while True:
                if (first.in_flight == 0 and probe and probe_job is None
                        and time.monotonic() >= probe_at):
                    probe_job = self.workload.start_reads(resolved.name, count=1)
                time.sleep(STALL_SAMPLE_GAP_S)
                second = io_stats(self.vm.agent, device)
                if (second.in_flight > 0 and first.in_flight > 0
                        and (second.reads_completed, second.writes_completed)
                        == (first.reads_completed, first.writes_completed)):
                    break
                if time.monotonic() > deadline:
                    hint = "" if probe else " (no I/O in flight: start a Workload, or probe=True)"
                    raise FaultError(f"{fault} at {target}: {device} showed no stuck request "
                                     f"within {timeout_s:.1f}s (last: {second}){hint}")
                first = second
        except BaseException:
            backend.resume()
            raise
        record = FaultRecord(fault, resolved.name, resolved.device.qdev_id, requested_ns,
                             injected_ns, time.monotonic_ns(),
                             {"device": device, "in_flight": second.in_flight,
                              "probe_pid": probe_job.pid if probe_job else None})
        stall = QueueStall(record, backend, resume_after_s)
        stall.probe_job = probe_job
        self._stalls[resolved.name] = stall
        return stall

    @action("queue-stall")
    def resume_queue(self, target: str, timeout_s: float = STALL_TIMEOUT_S) -> FaultRecord:
        """SIGCONT the slot's qemu-nbd; verified when the stuck requests complete (a device model:
        ModelFaults._resume_model_queue)."""
        fault = "queue-resume"
        model = self._model_target(fault, target)
        if model is not None:
            return self._resume_model_queue(target, model, timeout_s)
        resolved, backend, device = self._queue_target(fault, target)
        stall = self._stalls.pop(resolved.name, None)
        if stall is None and not backend.stalled:
            raise FaultError(f"{fault} at {target}: the queue is not stalled")
        before = io_stats(self.vm.agent, device)
        requested_ns = time.monotonic_ns()
        by = "resume_queue"
        if stall is not None:
            by = "timer" if stall.resumed else by
            resumed_ns = stall.resume()
            requested_ns = min(requested_ns, resumed_ns)
        else:
            backend.resume()
            resumed_ns = time.monotonic_ns()

        def drained():
            now = io_stats(self.vm.agent, device)
            done = now.in_flight == 0 or (now.reads_completed + now.writes_completed
                                          > before.reads_completed + before.writes_completed)
            return now if done else None

        after = self._wait(fault, target, timeout_s, drained,
                           f"the stuck requests on {device} completing")
        return FaultRecord(fault, resolved.name, resolved.device.qdev_id, requested_ns, resumed_ns,
                           time.monotonic_ns(),
                           {"device": device, "in_flight": after.in_flight, "resumed_by": by})

    @action("queue-slow")
    def slow_queue(self, target: str, iops: int = 1, timeout_s: float = IO_TIMEOUT_S) -> FaultRecord:
        """Limit the slot's queue to `iops` requests/s (its throttle group's iops-total).

        Verified by QOM reading the limit back and, for iops <= 20, by timing two
        direct reads in the guest (the second waits about 1/iops s). A device model slows its own
        queue (ModelFaults._slow_model_queue).
        """
        fault = "queue-slow"
        if not isinstance(iops, int) or iops < 1:
            raise FaultError(f"{fault} at {target}: iops must be a whole number >= 1, not {iops!r}")
        model = self._model_target(fault, target)
        if model is not None:
            return self._slow_model_queue(target, model, iops, timeout_s)
        resolved, _backend, device = self._queue_target(fault, target)
        self._refuse_if_stalled(fault, resolved, "the verification read would hang")
        requested_ns = time.monotonic_ns()
        self._set_iops(fault, target, resolved.name, iops)
        injected_ns = time.monotonic_ns()
        self._slowed.add(resolved.name)
        details: dict = {"iops": iops, "device": device, "throttle_group": throttle_group(resolved.name)}
        if iops <= SLOW_TIMING_MAX_IOPS:
            read = read_blocks(self.vm.agent, device, count=2, skip=_scratch_block(),
                               timeout_s=timeout_s + 2.0 / iops)
            expected = 0.5 / iops
            if not read.ok or read.guest_seconds is None or read.guest_seconds < expected:
                self._set_iops(fault, target, resolved.name, 0)
                self._slowed.discard(resolved.name)
                raise FaultError(f"{fault} at {target}: two direct reads on {device} took "
                                 f"{read.guest_seconds} s (expected >= {expected:.2f} s; dd: "
                                 f"{read.stderr[-200:]})")
            details["two_reads_s"] = read.guest_seconds
        return FaultRecord(fault, resolved.name, resolved.device.qdev_id, requested_ns, injected_ns,
                           time.monotonic_ns(), details)

    @action("queue-slow")
    def restore_queue_speed(self, target: str) -> FaultRecord:
        """Lift the slot's throttle limit (iops-total 0 = unlimited); verified by QOM (a device
        model: its own knob, ModelFaults._restore_model_queue_speed)."""
        fault = "queue-slow-lift"
        model = self._model_target(fault, target)
        if model is not None:
            return self._restore_model_queue_speed(model)
        resolved, _backend, _device = self._queue_target(fault, target)
        requested_ns = time.monotonic_ns()
        self._set_iops(fault, target, resolved.name, 0)
        injected_ns = time.monotonic_ns()
        self._slowed.discard(resolved.name)
        return FaultRecord(fault, resolved.name, resolved.device.qdev_id, requested_ns, injected_ns,
                           time.monotonic_ns(), {"iops": 0})

    def _set_iops(self, fault: str, target: str, slot: str, iops: int) -> None:
        path = f"/objects/{throttle_group(slot)}"
        self._qmp(fault, target, "qom-set", {"path": path, "property": "limits",
                                             "value": {"iops-total": iops}})
        limits = self._qmp(fault, target, "qom-get", {"path": path, "property": "limits"})
        if limits.get("iops-total") != iops:
            raise FaultError(f"{fault} at {target}: {path} reads back iops-total "
                             f"{limits.get('iops-total')}, not {iops}")

    @action("queue-error")
    def inject_io_errors(self, target: str, timeout_s: float = IO_TIMEOUT_S) -> FaultRecord:
        """Make every request on the slot's queue fail (blkdebug swapped in under its raw node).

        Verified by a direct read in the guest failing. QEMU's nvme reports any
        failed read as "Unrecovered Read Error", which the guest kernel turns into
        ENODATA ("critical medium error"), not EIO: details["guest_error"] has dd's
        message.
        """
        fault = "io-errors"
        resolved, _backend, device = self._queue_target(fault, target)
        self._refuse_if_stalled(fault, resolved, "the verification read would hang")
        slot = resolved.name
        if slot in self._erroring or self._node_exists(_error_node(slot)):
            raise FaultError(f"{fault} at {target}: I/O errors are already injected")
        rules = [{"event": event, "errno": 5, "once": False} for event in ("read_aio", "write_aio")]
        requested_ns = time.monotonic_ns()
        self._qmp(fault, target, "blockdev-add", {
            "driver": "blkdebug", "node-name": _error_node(slot), "image": queue_nbd_node(slot),
            "inject-error": rules})
        try:
            self._reopen_raw(fault, target, slot, _error_node(slot))
        except FaultError:
            self._qmp(fault, target, "blockdev-del", {"node-name": _error_node(slot)})
            raise
        injected_ns = time.monotonic_ns()
        self._erroring.add(slot)
        read = read_blocks(self.vm.agent, device, count=1, skip=_scratch_block(), timeout_s=timeout_s)
        if read.ok or not any(text in read.stderr for text in GUEST_READ_ERRORS):
            self.clear_io_errors(slot)
            raise FaultError(f"{fault} at {target}: a direct read on {device} did not fail with an "
                             f"I/O error (exit {read.exit_code}: {read.stderr[-200:]})")
        return FaultRecord(fault, slot, resolved.device.qdev_id, requested_ns, injected_ns,
                           time.monotonic_ns(),
                           {"device": device, "guest_error": read.stderr.splitlines()[0]})

    @action("queue-error")
    def clear_io_errors(self, target: str, timeout_s: float = IO_TIMEOUT_S) -> FaultRecord:
        """Put the NBD node back under the raw node and drop blkdebug; verified by a good read."""
        fault = "io-errors-clear"
        resolved, _backend, device = self._queue_target(fault, target)
        slot = resolved.name
        if not self._node_exists(_error_node(slot)):
            raise FaultError(f"{fault} at {target}: no I/O errors are injected")
        requested_ns = time.monotonic_ns()
        self._reopen_raw(fault, target, slot, queue_nbd_node(slot))
        self._qmp(fault, target, "blockdev-del", {"node-name": _error_node(slot)})
        injected_ns = time.monotonic_ns()
        self._erroring.discard(slot)
        if self._backend(slot).stalled:
            verified_ns, details = injected_ns, {"device": device, "read": "skipped (stalled)"}
        else:
            read = read_blocks(self.vm.agent, device, count=1, skip=_scratch_block(),
                               timeout_s=timeout_s)
            if not read.ok:
                raise FaultError(f"{fault} at {target}: a direct read on {device} still fails: "
                                 f"{read.stderr[-200:]}")
            verified_ns, details = time.monotonic_ns(), {"device": device}
        return FaultRecord(fault, slot, resolved.device.qdev_id, requested_ns, injected_ns,
                           verified_ns, details)

    def _reopen_raw(self, fault: str, target: str, slot: str, file_node: str) -> None:
        self._qmp(fault, target, "blockdev-reopen", {"options": [
            {"driver": "raw", "node-name": queue_format_node(slot), "file": file_node}]})

    def _node_exists(self, node: str) -> bool:
        return any(n.get("node-name") == node for n in self.vm.qmp.execute("query-named-block-nodes"))

    def _queue_target(self, fault: str, name: str):
        resolved = self._resolve(fault, name)
        kind = resolved.kind
        if kind is None or kind.queue != "nbd":
            what = f"{kind.name} ({resolved.device.ids})" if kind else resolved.device.ids
            raise FaultError(f"{fault} at {name}: slot {resolved.name} holds {what}, which has no "
                             f"command queue (queue faults need an nvme stand-in)")
        if not self._node_exists(queue_node(resolved.name)):
            raise FaultError(f"{fault} at {name}: no queue node {queue_node(resolved.name)} in QEMU")
        backend = self._backend(resolved.name)
        try:
            device = block_device(self.vm.agent, resolved.device.bdf)
        except WaitTimeout as exc:
            raise FaultError(f"{fault} at {name}: {exc}") from None
        return resolved, backend, device

    def _backend(self, slot: str):
        backend = self.vm.queues.get(slot)
        if backend is None or not backend.alive():
            raise FaultError(f"queue of slot {slot}: its qemu-nbd backend is not running")
        return backend


def _error_node(slot: str) -> str:
    return f"q-{slot}-err"


def _scratch_block() -> int:
    """A 4 KiB block for verification reads: varied so nothing serves it from a cache."""
    return time.monotonic_ns() // 1000 % 8192
