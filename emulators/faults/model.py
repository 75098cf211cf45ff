"""Faults of a slot that holds a device model (vfio-user): the model's own knobs, verified in the guest.

A model's queue is its BAR0 command queue: a stall sticks it (completions stop, every
register still answers, nothing in QEMU freezes), so a reset or removal of a stuck model
is safe at any time. Work in flight is submitted from the guest through the doorbell
(sysfs resource0, as a user-space driver would), and every effect is read back from the
guest the same way. The queue actions are declared once, in queue.py, and call the model's
implementations here (`_stall_model_queue`, ...) for a model slot.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from ..errors import FaultError, QmpError
from ..host_action import action
from ..vfio_user import guest_bar
from ..vfio_user.hot_add import hot_add_model
from ..vfio_user.registers import register_map
from .base import FaultRecord, FaultsBase, Target
from .stall import STALL_SAMPLE_GAP_S, STALL_TIMEOUT_S, QueueStall

# Faults only a model slot has (queue-stall and queue-slow it shares with nvme slots).
MODEL_ONLY_CAPABILITIES = frozenset({"fell-off-bus", "firmware-mismatch", "link-degrade",
                                     "reset-not-ready"})
MODEL_QUEUE_CAPABILITIES = frozenset({"queue-stall", "queue-slow"})
STUCK_COMMANDS = 4  # submitted through the doorbell when a stall finds nothing in flight
GUEST_TIMEOUT_S = 60.0
HOT_ADD_TIMEOUT_S = 20.0  # device_add -> the guest has the device
ALL_ONES = 0xFFFFFFFF


class ModelQueue:
    """The stall handle's backend for a model: `resume()` unsticks the queue (no signals)."""

    def __init__(self, device):
        self._device = device
        self._log = device.queue.hold_log  # this stall's record (a later stall starts its own)

    @property
    def stalled(self) -> bool:
        return self._device.queue.stuck

    def hold_log(self):
        """A copy of the model's own record of this stall (registers.HoldLog)."""
        with self._device.lock:
            return copy.deepcopy(self._log)

    def resume(self) -> None:
        self._device.stick_queue(False)

    def resume_after_next_look(self) -> None:
        self._device.answer_queue_after_next_look()


class ModelFaults(FaultsBase):
    # -- the guest's view of the registers ------------------------------------------------------
    def model_registers(self, fault: str, target: Target, *names: str) -> dict[str, int]:
        """Read BAR0 registers from the guest (guest_bar.py over the agent)."""
        regs = register_map()
        out = self._guest_bar(fault, target, "read", *(hex(regs[n]) for n in names))
        by_offset = {}
        for line in out.splitlines():
            if line.strip():
                off, value = line.split()
                by_offset[int(off, 0)] = int(value, 0)
        return {n: by_offset[regs[n]] for n in names}

    def _guest_bar(self, fault: str, target: Target, *args: str) -> str:
        code = Path(guest_bar.__file__).read_bytes()
        result = self.vm.agent.run(["python3", "-", target.device.bdf, *args], stdin=code,
                                   timeout_s=GUEST_TIMEOUT_S)
        if result.exit_code != 0:
            raise FaultError(f"{fault} at {target.name}: guest register access failed: "
                             f"{result.stderr[-300:]}")
        return result.stdout

    def _model_target(self, fault: str, name: str) -> Target | None:
        """The resolved target when it holds a model, else None (a stock device)."""
        resolved = self._resolve(fault, name)
        if resolved.kind is None or not resolved.kind.model:
            return None
        if self.vm.models is None:
            raise FaultError(f"{fault} at {name}: slot {resolved.name} holds a model but the VM "
                             f"serves none")
        return resolved

    def _need_model(self, fault: str, name: str) -> Target:
        resolved = self._model_target(fault, name)
        if resolved is None:
            resolved = self._resolve(fault, name)
            what = f"{resolved.kind.name} ({resolved.device.ids})" if resolved.kind else resolved.device.ids
            raise FaultError(f"{fault} at {name}: slot {resolved.name} holds {what}, not a device model")
        return resolved

    def _record(self, fault, target: Target, requested_ns, injected_ns, details) -> FaultRecord:
        return FaultRecord(fault, target.name, target.device.qdev_id or target.name, requested_ns,
                           injected_ns, time.monotonic_ns(), details)

    def _wait_registers(self, fault, target, names, check, awaited, timeout_s=STALL_TIMEOUT_S):
        """Read `names` from the guest until check(values) holds; FaultError after timeout_s."""
        def probe():
            values = self.model_registers(fault, target, *names)
            return values if check(values) else None
        return self._wait(fault, target.name, timeout_s, probe, awaited)

    # -- queue (QueueFaults' actions call these for a model slot) --------------------------------
    def _stall_model_queue(self, target: str, resolved: Target, resume_after_s: float | None,
                           probe: bool, timeout_s: float) -> QueueStall:
        """Stick the model's queue; with nothing in flight, STUCK_COMMANDS are submitted from the
        guest. Verified when the guest reads in-flight > 0 and no completion over a gap."""
        fault = "queue-stall"
        device = self.vm.models.device(resolved.name)
        if device.queue.stuck:
            raise FaultError(f"{fault} at {target}: the queue is already stalled")
        requested_ns = time.monotonic_ns()
        device.stick_queue()
        injected_ns = time.monotonic_ns()
        try:
            first = self.model_registers(fault, resolved, "queue_in_flight", "queue_head")
            submitted = 0
            if first["queue_in_flight"] == 0:
                if not probe:
                    raise FaultError(f"{fault} at {target}: nothing in flight (probe=False)")
                self._guest_bar(fault, resolved, "write", hex(register_map()["queue_doorbell"]),
                                hex(STUCK_COMMANDS))
                submitted = STUCK_COMMANDS
                first = self.model_registers(fault, resolved, "queue_in_flight", "queue_head")
            time.sleep(STALL_SAMPLE_GAP_S)
            second = self.model_registers(fault, resolved, "queue_in_flight", "queue_head")
            stuck = second["queue_head"] == first["queue_head"]
            if not (0 < second["queue_in_flight"] != ALL_ONES and stuck):
                raise FaultError(f"{fault} at {target}: the guest saw no stuck queue "
                                 f"(before {first}, after {STALL_SAMPLE_GAP_S}s {second})")
        except BaseException:
            device.stick_queue(False)
            raise
        record = self._record(fault, resolved, requested_ns, injected_ns,
                              {"model": resolved.kind.model, "in_flight": second["queue_in_flight"],
                               "submitted": submitted})
        stall = QueueStall(record, ModelQueue(device), resume_after_s)
        self._stalls[resolved.name] = stall
        return stall

    def _resume_model_queue(self, target: str, resolved: Target, timeout_s: float) -> FaultRecord:
        """Unstick the model's queue; verified when the guest reads the queue drained."""
        fault = "queue-resume"
        device = self.vm.models.device(resolved.name)
        stall = self._stalls.pop(resolved.name, None)
        if stall is None and not device.queue.stuck:
            raise FaultError(f"{fault} at {target}: the queue is not stalled")
        requested_ns = time.monotonic_ns()
        if stall is not None:
            resumed_ns = stall.resume()
        else:
            device.stick_queue(False)
            resumed_ns = time.monotonic_ns()
        after = self._wait_registers(fault, resolved, ("queue_in_flight",),
                                     lambda r: r["queue_in_flight"] == 0, "the queue draining",
                                     timeout_s)
        return self._record(fault, resolved, min(requested_ns, resumed_ns), resumed_ns,
                            {"in_flight": after["queue_in_flight"]})

    def _slow_model_queue(self, target: str, resolved: Target, iops: int, timeout_s: float) -> FaultRecord:
        """Each of the model's commands takes 1/iops s; verified by two commands from the guest not
        being done before 2/iops s have passed."""
        fault = "queue-slow"
        device = self.vm.models.device(resolved.name)
        if device.queue.stuck:
            raise FaultError(f"{fault} at {target}: the slot's queue is stalled")
        requested_ns = time.monotonic_ns()
        device.slow_queue(1.0 / iops)
        injected_ns = time.monotonic_ns()
        self._slowed.add(resolved.name)
        details = {"iops": iops, "model": resolved.kind.model}
        regs = register_map()
        started = time.monotonic()
        self._guest_bar(fault, resolved, "write", hex(regs["queue_doorbell"]), "0x2")
        seen = self.model_registers(fault, resolved, "queue_in_flight")
        elapsed = time.monotonic() - started
        if seen["queue_in_flight"] == 0 and elapsed < 2.0 / iops:
            self.restore_queue_speed(resolved.name)
            raise FaultError(f"{fault} at {target}: two commands at {iops} iops were done after "
                             f"{elapsed:.2f} s (expected {2.0 / iops:.2f} s)")
        details["in_flight_after_submit"] = seen["queue_in_flight"]
        details["checked_after_s"] = round(elapsed, 3)
        return self._record(fault, resolved, requested_ns, injected_ns, details)

    def _restore_model_queue_speed(self, resolved: Target) -> FaultRecord:
        requested_ns = time.monotonic_ns()
        self.vm.models.device(resolved.name).slow_queue(None)
        self._slowed.discard(resolved.name)
        return self._record("queue-slow-lift", resolved, requested_ns, time.monotonic_ns(), {})

    # -- faults only models have ------------------------------------------------------------------
    @action("fell-off-bus")
    def fall_off_bus(self, target: str, fallen: bool = True,
                     timeout_s: float = STALL_TIMEOUT_S) -> FaultRecord:
        """Every read returns all ones, no hot-plug event; verified by the guest's BAR0 read."""
        fault = "fell-off-bus" if fallen else "back-on-bus"
        resolved = self._need_model(fault, target)
        requested_ns = time.monotonic_ns()
        self.vm.models.device(resolved.name).fall_off_bus(fallen)
        injected_ns = time.monotonic_ns()
        if fallen:
            self._fallen.add(resolved.name)
        else:
            self._fallen.discard(resolved.name)
        regs = self._wait_registers(fault, resolved, ("magic",),
                                    lambda r: (r["magic"] == ALL_ONES) == fallen,
                                    "all-ones reads" if fallen else "the register file answering",
                                    timeout_s)
        return self._record(fault, resolved, requested_ns, injected_ns, {"magic": f"{regs['magic']:#x}"})

    def _turn_knob(self, fault: str, target: str, turn, slots: set[str], on: bool):
        """Set one of a model's knobs: turn(device); a ValueError from the model becomes a FaultError
        naming the fault; `slots` records the slot while the knob is on (restore_model_faults undoes
        it). Returns (target, device, requested_ns, injected_ns)."""
        resolved = self._need_model(fault, target)
        device = self.vm.models.device(resolved.name)
        requested_ns = time.monotonic_ns()
        try:
            turn(device)
        except ValueError as exc:
            raise FaultError(f"{fault} at {target}: {exc}") from None
        injected_ns = time.monotonic_ns()
        (slots.add if on else slots.discard)(resolved.name)
        return resolved, device, requested_ns, injected_ns

    @action("firmware-mismatch")
    def mismatch_firmware(self, target: str, version: str | None = "0.0.1",
                          timeout_s: float = STALL_TIMEOUT_S) -> FaultRecord:
        """The firmware register reports `version` (None: the model's own); verified in the guest."""
        fault = "firmware-mismatch"
        resolved, device, requested_ns, injected_ns = self._turn_knob(
            fault, target, lambda d: d.set_firmware_version(version), self._firmware, version is not None)
        want = device.registers.firmware_version
        self._wait_registers(fault, resolved, ("firmware_version",),
                             lambda r: r["firmware_version"] == want, f"firmware register {want:#x}",
                             timeout_s)
        return self._record(fault, resolved, requested_ns, injected_ns, {"version": version})

    @action("firmware-mismatch")
    def hot_add_with_firmware(self, slot: str, version: str = "0.0.1", device_id: str | None = None,
                              timeout_s: float = HOT_ADD_TIMEOUT_S) -> FaultRecord:
        """Hot-add the model an empty slot accepts, its firmware register reporting `version` from
        the start (a hot-add serves a fresh device: arming it before device_add leaves the guest no
        moment with the model's own firmware). Verified when the guest has the device and reads
        `version` from the register. details: bdf, kind, version."""
        fault = "firmware-mismatch"
        resolved = self._resolve(fault, slot, need_device=False)
        if resolved.device is not None:
            raise FaultError(f"{fault} at {slot}: hot-add needs an empty slot; it holds "
                             f"{resolved.device.qdev_id or resolved.device.bdf}")
        kind = self.vm.profile.kind(resolved.slot.accepts)
        if not kind.model:
            raise FaultError(f"{fault} at {slot}: slot {resolved.name} accepts {kind.name}, not a device "
                             f"model (stock devices have no firmware register)")
        requested_ns = time.monotonic_ns()
        try:
            added = hot_add_model(self.vm, resolved.name, device_id, firmware_version=version)
        except (ValueError, QmpError) as exc:
            raise FaultError(f"{fault} at {slot}: {exc}") from None
        self._firmware.add(resolved.name)
        if not self.guest_has_device(added.bdf, timeout_s):
            raise FaultError(f"{fault} at {slot}: QEMU added {added.device_id} but the guest did not "
                             f"show {added.bdf} within {timeout_s:.0f}s")
        target = self._resolve(fault, resolved.name)
        want = self.vm.models.device(resolved.name).registers.firmware_version
        self._wait_registers(fault, target, ("firmware_version",),
                             lambda r: r["firmware_version"] == want, f"firmware register {want:#x}",
                             timeout_s)
        return self._record(fault, target, requested_ns, added.returned_ns,
                            {"bdf": added.bdf, "kind": kind.name, "version": version})

    @action("reset-not-ready")
    def delay_reset_ready(self, target: str, ready_after_s: float | None = 4.0) -> FaultRecord:
        """After its next resets (FLR, device reset) the card stays not ready for ready_after_s: every
        read returns all ones, so the guest kernel's reset waits, polling config space ("not ready
        ... after FLR; waiting"), and a reset budget shorter than that is overrun (RST-02). None lifts
        it. Takes effect at a reset, so nothing is visible in the guest until then; the guest-side
        effect is shown by tests/integration/test_model_faults.py."""
        fault = "reset-not-ready"
        resolved, _device, requested_ns, injected_ns = self._turn_knob(
            fault, target, lambda d: d.delay_reset_ready(ready_after_s), self._slow_reset,
            bool(ready_after_s))
        return self._record(fault, resolved, requested_ns, injected_ns, {"ready_after_s": ready_after_s})

    @action("link-degrade")
    def degrade_link(self, target: str, speed: str | None = "8", width: int | None = 8,
                     timeout_s: float = STALL_TIMEOUT_S) -> FaultRecord:
        """Link Status below the capability (None, None: trained at capability); verified by lspci."""
        fault = "link-degraded"
        resolved, device, requested_ns, injected_ns = self._turn_knob(
            fault, target, lambda d: d.train_link(speed, width), self._degraded, bool(speed or width))
        speed_code, got_width = device.config.link_status()
        bdf = resolved.device.bdf

        def shows():
            out = self.vm.agent.run(["lspci", "-s", bdf, "-vv"], timeout_s=30).stdout
            return next((ln for ln in out.splitlines() if "LnkSta:" in ln and f"Width x{got_width}" in ln),
                        None)
        line = self._wait(fault, target, timeout_s, shows, f"LnkSta width x{got_width} in lspci")
        return self._record(fault, resolved, requested_ns, injected_ns,
                            {"speed": speed, "width": width, "lnksta": line.strip()})

    @action()
    def restore_model_faults(self) -> list[str]:
        """Undo fell-off-bus, firmware and link faults still in effect; the problems met.

        A slot emptied since (its model removed) has nothing left to undo.
        """
        problems = []
        for slots in (self._fallen, self._firmware, self._degraded, self._slow_reset):
            for slot in list(slots):
                if self._resolve("restore", slot, need_device=False).device is None:
                    slots.discard(slot)
        for undo_one, slots in ((lambda s: self.fall_off_bus(s, False), self._fallen),
                                (lambda s: self.mismatch_firmware(s, None), self._firmware),
                                (lambda s: self.degrade_link(s, None, None), self._degraded),
                                (lambda s: self.delay_reset_ready(s, None), self._slow_reset)):
            for slot in sorted(slots):
                try:
                    undo_one(slot)
                except FaultError as exc:
                    problems.append(str(exc))
        return problems

