"""BAR0 registers and the command queue: doorbell, completions, stuck, slow, reset."""

from hilconform.emulators.vfio_user.model import load_model
from hilconform.emulators.vfio_user.registers import CommandQueue, RegisterFile, register_map


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make(service_s=0.001):
    clock = FakeClock()
    queue = CommandQueue(depth=8, service_s=service_s, clock=clock)
    return clock, queue, RegisterFile(load_model("a100-sxm4"), queue), register_map()


def test_identity_registers():
    _clock, _q, regs, r = make()
    assert regs.read32(r["magic"]) == r["magic_value"]
    assert regs.read32(r["ident"]) == 0x10DE | 0x20B0 << 16
    assert regs.read32(r["firmware_version"]) == 92 << 16 | 0 << 8 | 36
    assert regs.read(r["ident"] + 2, 2) == (0x20B0).to_bytes(2, "little")


def test_commands_complete_in_order_when_due():
    clock, _q, regs, r = make()
    regs.write(r["queue_doorbell"], (3).to_bytes(4, "little"))
    assert regs.read32(r["queue_in_flight"]) == 3 and regs.read32(r["queue_tail"]) == 3
    clock.now += 0.0015
    assert regs.read32(r["queue_head"]) == 1
    clock.now += 0.01
    assert regs.read32(r["queue_in_flight"]) == 0 and regs.read32(r["queue_completions"]) == 3


def test_stuck_queue_completes_nothing_but_registers_answer():
    clock, queue, regs, r = make()
    queue.set_stuck(True)
    regs.write32(r["queue_doorbell"], 2)
    clock.now += 10
    assert regs.read32(r["queue_in_flight"]) == 2
    assert regs.read32(r["magic"]) == r["magic_value"]
    queue.set_stuck(False)
    clock.now += 0.0025
    assert regs.read32(r["queue_in_flight"]) == 0


def test_slow_queue_stretches_service_time():
    clock, queue, regs, r = make()
    queue.set_service_time(1.0)
    regs.write32(r["queue_doorbell"], 1)
    clock.now += 0.5
    assert regs.read32(r["queue_in_flight"]) == 1
    clock.now += 0.6
    assert regs.read32(r["queue_in_flight"]) == 0


def test_full_queue_rejects_and_reset_clears():
    _clock, _q, regs, r = make()
    regs.write32(r["queue_doorbell"], 10)
    assert regs.read32(r["queue_in_flight"]) == 8 and regs.read32(r["queue_rejected"]) == 2
    regs.write32(r["queue_control"], r["queue_reset_bit"])
    assert regs.read32(r["queue_in_flight"]) == 0 and regs.read32(r["queue_tail"]) == 0


def test_stuck_queue_answers_after_the_next_look_at_its_in_flight_count():
    """HP-02's precondition: the drain's next read still finds the command in flight, the one
    after finds it answered; other registers do not count as a look."""
    clock, queue, regs, r = make()
    regs.write(r["queue_doorbell"], (1).to_bytes(4, "little"))
    queue.set_stuck(True)
    clock.now += 1.0
    queue.answer_after_next_look()
    assert regs.read32(r["queue_head"]) == 0 and queue.stuck  # not a look at the in-flight count
    clock.now += 1.0
    assert regs.read32(r["queue_in_flight"]) == 1  # the look: still in flight
    assert not queue.stuck and queue.answered_at == clock.now
    clock.now += 0.002
    assert regs.read32(r["queue_in_flight"]) == 0


def test_answer_after_next_look_is_dropped_by_a_new_stall_and_ignored_when_not_stuck():
    clock, queue, regs, r = make()
    queue.answer_after_next_look()
    assert not queue.answer_on_look  # nothing stuck: nothing to arm
    regs.write(r["queue_doorbell"], (1).to_bytes(4, "little"))
    queue.set_stuck(True)
    queue.answer_after_next_look()
    queue.set_stuck(True)  # stalled afresh: the earlier arming is gone
    assert regs.read32(r["queue_in_flight"]) == 1 and queue.stuck
