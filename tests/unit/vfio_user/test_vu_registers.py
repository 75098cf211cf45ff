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


def test_the_hold_log_records_what_each_look_found_and_when_the_queue_was_first_seen_empty():
    """HP-02 judges a drain against the model's own record: a drain that reports ok before any
    read found the queue empty reported done with the read in flight."""
    clock, queue, regs, r = make()
    regs.write(r["queue_doorbell"], (2).to_bytes(4, "little"))
    queue.set_stuck(True)
    log = queue.hold_log
    assert log.stuck_at == clock.now and log.in_flight_at_stall == 2
    clock.now += 0.5
    assert regs.read32(r["queue_in_flight"]) == 2  # a look before the arming: held
    clock.now += 0.5
    queue.answer_after_next_look()
    assert log.armed_at == clock.now
    clock.now += 0.1
    assert regs.read32(r["queue_in_flight"]) == 2  # the look that lets it go: still in flight
    assert log.answered_at == clock.now and log.answered_in_flight == 2 and log.emptied_at is None
    clock.now += 0.01
    assert regs.read32(r["magic"]) == r["magic_value"] and log.emptied_at is None  # says nothing of the queue
    assert regs.read32(r["queue_in_flight"]) == 0
    assert log.emptied_at == clock.now and log.emptied_register == "queue_in_flight"
    assert [v for _t, v in log.looks] == [2, 2]  # the reads up to the one that found it empty
    assert log.released_at is None  # answered by a look, not by the host


def test_a_hold_log_of_a_queue_never_looked_at_shows_it_never_answered():
    clock, queue, regs, r = make()
    regs.write(r["queue_doorbell"], (1).to_bytes(4, "little"))
    queue.set_stuck(True)
    queue.answer_after_next_look()
    clock.now += 1.0
    assert regs.read32(r["queue_head"]) == 0  # not a look at the in-flight count: still held
    log = queue.hold_log
    assert log.answered_at is None and log.emptied_at is None and log.looks == []
    queue.set_stuck(False)  # the host lets it go (resume)
    assert log.released_at == clock.now
    clock.now += 0.01
    assert regs.read32(r["queue_head"]) == 1 and log.emptied_at == clock.now
    queue.set_stuck(True)
    assert queue.hold_log is not log  # each stall its own record


def test_a_read_split_byte_by_byte_is_one_look():
    """The kernel's copy of a mapped BAR may read a register byte by byte: the access to its
    lowest byte is the look (it answers a held queue); the later bytes of the same read are not
    a look, nor a read that finds the queue empty, however long after they come."""
    clock, queue, regs, r = make()
    regs.write32(r["queue_doorbell"], 2)
    queue.set_stuck(True)
    queue.answer_after_next_look()
    at = r["queue_in_flight"]
    assert regs.read(at, 1) == b"\x02"  # the look: answers, still in flight
    log = queue.hold_log
    assert log.answered_at == clock.now and log.answered_in_flight == 2
    clock.now += 0.01  # both commands due by now
    assert regs.read(at + 1, 1) == b"\x00" and regs.read(at + 2, 2) == b"\x00\x00"
    assert log.emptied_at is None and len(log.looks) == 1  # the same read's later bytes
    assert regs.read(at, 4) == b"\x00\x00\x00\x00"  # the next read: found empty
    assert log.emptied_at == clock.now
