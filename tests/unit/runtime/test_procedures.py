"""Hot-add and hot-remove procedures against fake sysfs trees (HP-01..05, RST-01/02)."""

from __future__ import annotations

import struct
import threading
import time

import pytest
from fakesysfs import ConfigBuilder, FakeSysfs, io_bar, mem_bar
from test_service import TIMEOUT, Client, Harness, healthy_nvme

from hilconform.runtime import procedures, protocol
from hilconform.runtime.kernel_log import parse_record
from hilconform.runtime.sysfs import Sysfs

NVME = Harness.NVME


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.stop()


def steps(client: Client, procedure: str) -> list[tuple[str, str]]:
    return [(d["step"], d["status"]) for d in client.events("procedure", procedure=procedure)]


def command_register(harness: Harness, bdf: str) -> int:
    raw = (harness.fake.device_dir(bdf) / "config").read_bytes()
    return struct.unpack_from("<H", raw, 4)[0]


# --- hot-add (HP-05, LIFE-02) --------------------------------------------------------------------
def test_hot_added_device_passes_every_step_and_joins_the_pool(harness):
    harness.add_port()
    harness.start(firmware={"1b36:0010": ["0.9", "1.0"]})
    c = harness.client()
    harness.add_nvme()
    change = harness.source.emit("add", NVME)
    found = c.wait_event("discovered", device=NVME)
    assert found["udev_received_ns"] == change.received_ns and found["cause"] == "hot_add"
    c.wait_state(NVME, "HEALTHY")
    c.wait_event("procedure", procedure="hot_add", step="end")
    assert steps(c, "hot_add") == [
        ("begin", "started"),
        ("link_active", "ok"),
        ("firmware", "ok"),
        ("mmio", "ok"),
        ("interrupts", "ok"),
        ("join_pool", "ok"),
        ("end", "ok"),
    ]
    main = [t["to"] for t in c.events("transition", device=NVME, view="main")]
    assert main == ["FIRMWARE_LOADED", "INITIALIZED"]
    assert c.ok("device", {"device": NVME})["in_pool"] is True


def no_msix_nvme() -> bytes:
    b = ConfigBuilder(command=0x0406)
    b.bar(0, 0xFE000004)
    b.msix(65, enabled=False)
    b.pcie(port_type=0, flr=True)
    return b.build()


def untrained_nvme() -> bytes:
    # The port says the link is down and the device's own link status agrees (width 0).
    b = ConfigBuilder(command=0x0406)
    b.bar(0, 0xFE000004)
    b.msix(65, enabled=True)
    b.pcie(port_type=0, flr=True, link_cap=(1, 1), link_status=(1, 0))
    return b.build()


FAILURES = {
    "link_active": dict(port_dll_active=False, config=untrained_nvme()),
    "firmware": dict(firmware="0.1"),
    "mmio": dict(mmio=b"\xff" * 4096),
    "interrupts": dict(driver=None, msi_irqs=(), config=no_msix_nvme()),
}


@pytest.mark.parametrize("failing", list(FAILURES))
def test_a_failing_step_is_named_and_keeps_the_device_out_of_the_pool(harness, failing):
    kw = dict(FAILURES[failing])
    harness.add_port(dll_active=kw.pop("port_dll_active", True))
    harness.add_nvme(**kw)
    harness.start(firmware={"1b36:0010": "1.0"})
    c = harness.client()
    t = c.wait_state(NVME, "FAULTED")
    assert t["cause"] == f"hot_add:{failing}"
    end = c.wait_event("procedure", procedure="hot_add", step="end")
    assert end["status"] == "failed" and end["failed_step"] == failing
    assert (failing, "failed") in steps(c, "hot_add")
    assert not any(s == "join_pool" for s, _ in steps(c, "hot_add"))
    assert c.call("allocate", {"device": NVME})["error"]["code"] == protocol.NOT_HEALTHY
    assert c.ok("device", {"device": NVME})["in_pool"] is False


def test_port_dllla_off_but_device_trained_passes_link_step_with_the_disagreement(harness):
    # QEMU's ACPI-mode root ports never set DLLLA; a device that answers is reachable.
    harness.add_port(dll_active=False)
    harness.add_nvme()
    harness.start(firmware={"1b36:0010": "1.0"})
    c = harness.client()
    c.wait_state(NVME, "HEALTHY")
    link = c.events("procedure", procedure="hot_add", step="link_active")[0]
    assert link["status"] == "ok" and link["port_dll_link_active"] is False


def test_device_without_memory_bar_skips_mmio_with_a_reason(harness):
    harness.fake.add_device(
        "0000:00:05.0", ConfigBuilder(vendor=0x1234, device=0x11E8, class_code=0x00FF00).build()
    )
    harness.start()
    c = harness.client()
    c.wait_state("0000:00:05.0", "HEALTHY")
    mmio = c.events("procedure", procedure="hot_add", step="mmio")[0]
    assert mmio["status"] == "skipped" and mmio["skipped"] == "no memory BAR"


# --- orderly removal (HP-01..03) ------------------------------------------------------------------
def assert_orderly(c: Client) -> list[tuple[str, str]]:
    order = c.order()
    names = [o for o in order if o[0] in ("procedure", "deallocate", "removed")]
    idx = {key: i for i, key in enumerate(names)}
    for a, b in [
        (("procedure", "isolate"), ("procedure", "drain")),
        (("procedure", "drain"), ("procedure", "deallocate")),
        (("procedure", "deallocate"), ("procedure", "topology")),
        (("procedure", "topology"), ("procedure", "power_off")),
        (("procedure", "power_off"), ("removed", "")),
    ]:
        assert idx[a] < idx[b], f"{a} must come before {b}: {names}"
    return names


def test_remove_with_a_healthy_queue_drains_without_reset(harness):
    c = healthy_nvme(harness)
    lease = c.ok("allocate", {"device": NVME, "holder": "job"})
    summary = c.ok("remove", {"device": NVME})
    assert summary["ok"] and summary["drain"]["status"] == "ok" and "reset" not in summary
    names = assert_orderly(c)
    dealloc = c.events("deallocate", device=NVME)
    assert dealloc == [{"device": NVME, "lease": lease["lease"], "holder": "job", "reason": "hot_remove"}]
    assert names.index(("deallocate", "hot_remove")) < names.index(("procedure", "power_off"))
    assert not c.events("reset")
    assert harness.fake.slot_value("1") == "0"
    off = c.events("procedure", procedure="hot_remove", step="bus_master_off")[0]
    assert int(off["command_after"], 16) & 0x4 == 0 and int(off["command_before"], 16) & 0x4
    s = [step for step, _ in steps(c, "hot_remove")]
    # bus mastering off after the drain (work in flight can complete), before DEALLOCATE
    assert s.index("drain") < s.index("bus_master_off") < s.index("deallocate")
    assert s.index("deallocate") < s.index("bus_master_on") < s.index("power_off")  # driver shutdown
    assert command_register(harness, NVME) & 0x4  # given back to the nvme driver's remove()
    removed = c.wait_state(NVME, "REMOVED")
    assert removed["cause"] == "hot_remove"
    assert c.ok("inventory")["devices"] == []
    for d in c.events("procedure", procedure="hot_remove"):
        assert d["ts_ns"] > 0


def test_remove_with_a_stuck_queue_gives_up_at_the_timeout_and_resets(harness):
    c = healthy_nvme(harness)
    harness.fake.set_inflight(NVME, 1, 0)
    c.ok("allocate", {"device": NVME})
    t0 = time.monotonic()
    summary = c.ok("remove", {"device": NVME})
    drain = summary["drain"]
    assert drain["status"] == "timeout" and drain["depth"] == 1
    assert 250 <= drain["elapsed_ms"] <= 1500  # 300 ms default, generous margin
    assert time.monotonic() - t0 < TIMEOUT
    assert summary["reset"]["outcome"] == "ok" and summary["reset"]["methods"] == ["flr", "bus"]
    assert harness.fake.read_attr(NVME, "reset").strip() == "1"
    reset = c.wait_event("reset", device=NVME, source="drain_timeout")
    assert reset["outcome"] == "ok" and reset["duration_ms"] >= 0
    names = assert_orderly(c)
    assert names.index(("procedure", "reset")) < names.index(("deallocate", "hot_remove"))
    assert harness.fake.slot_value("1") == "0"


def test_wedged_reset_faults_the_device_without_blocking_the_removal(harness):
    c = healthy_nvme(harness, reset_timeout_ms=300)
    harness.fake.set_inflight(NVME, 0, 3)
    release = threading.Event()
    real_write = harness.svc.sysfs.write_attr

    def wedged(bdf, name, value):
        if name == "reset":
            release.wait(TIMEOUT)
        real_write(bdf, name, value)

    harness.svc.sysfs.write_attr = wedged
    c.ok("allocate", {"device": NVME})
    t0 = time.monotonic()
    summary = c.ok("remove", {"device": NVME})
    assert time.monotonic() - t0 < 5.0
    assert summary["reset"]["outcome"] == "timeout"
    faulted = c.wait_state(NVME, "FAULTED")
    assert faulted["cause"] == "hot_remove:reset_timeout"
    assert c.wait_event("deallocate", device=NVME)["reason"] == "faulted"
    c.wait_state(NVME, "REMOVED")
    on = c.events("procedure", procedure="hot_remove", step="bus_master_on")[0]
    assert on["status"] == "skipped" and "reset" in on["reason"]  # the kernel would block that access
    assert "result" in c.call("hello")  # still serving
    release.set()
    late = c.wait_event("reset", device=NVME, late=True)
    assert late["outcome"] == "ok"


def test_a_blocking_config_write_is_bounded(harness, monkeypatch):
    c = healthy_nvme(harness)
    block = threading.Event()
    monkeypatch.setattr(procedures, "CONFIG_WRITE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(procedures, "set_bus_master", lambda *a: block.wait(TIMEOUT) and {})
    t0 = time.monotonic()
    summary = c.ok("remove", {"device": NVME})
    block.set()
    assert summary["ok"] and time.monotonic() - t0 < 5.0
    assert [d["status"] for d in c.events("procedure", step="bus_master_off")] == ["timeout"]


def test_bus_master_can_be_cleared_before_the_drain(harness):
    c = healthy_nvme(harness, bus_master_off="before_drain")
    c.ok("remove", {"device": NVME})
    s = [step for step, _ in steps(c, "hot_remove")]
    assert s.index("isolate") < s.index("bus_master_off") < s.index("drain")


def test_remove_refusals(harness):
    c = healthy_nvme(harness)
    assert c.call("remove", {"device": "nope"})["error"]["code"] == protocol.UNKNOWN_DEVICE
    assert c.call("remove", {})["error"]["code"] == protocol.INVALID_PARAMS


# --- attention button (HP-01 via pciehp) and surprise removal (HP-04) ---------------------------------
def test_attention_button_removal_finishes_inside_the_pciehp_window(harness):
    c = healthy_nvme(harness)
    c.ok("allocate", {"device": NVME})
    t0 = time.monotonic()
    for line in (
        "6,1,100,-;pcieport 0000:00:02.0: pciehp: Slot(1): Attention button pressed",
        "6,2,101,-;pcieport 0000:00:02.0: pciehp: Slot(1): Powering off due to button press",
    ):
        harness.svc.on_kernel_event(parse_record(line))
    end = c.wait_event("procedure", procedure="hot_remove", step="end")
    assert end["status"] == "ok" and end["entry"] == "attention_button"
    assert time.monotonic() - t0 < 5.0  # before pciehp's 5 s blink ends
    assert_orderly(c)
    assert [k["kind"] for k in c.events("kernel")] == ["attention_button", "button_power_off"]


def test_surprise_removal_revokes_and_keeps_serving(harness):
    harness.add_nvme()
    harness.add_nvme("0000:02:00.0", port="0000:00:03.0", slot="2", serial="SN2")
    harness.start()
    c = harness.client()
    c.wait_state(NVME, "HEALTHY")
    c.wait_state("0000:02:00.0", "HEALTHY")
    lease = c.ok("allocate", {"device": NVME})
    harness.fake.remove_device(NVME)
    harness.source.emit("remove", NVME)
    dealloc = c.wait_event("deallocate", device=NVME)
    assert dealloc["reason"] == "surprise" and dealloc["lease"] == lease["lease"]
    removed = c.wait_state(NVME, "REMOVED")
    assert removed["from"] == "ALLOCATED" and removed["cause"] == "surprise"
    topo = c.wait_event("topology", cause="surprise")
    assert topo["devices"] == ["0000:02:00.0"]
    assert [d["device"] for d in c.ok("inventory")["devices"]] == ["0000:02:00.0"]
    assert c.ok("leases")["leases"] == []
    assert c.ok("allocate", {"device": "0000:02:00.0"})["devices"] == ["0000:02:00.0"]
    harness.source.emit("remove", NVME)  # a duplicate remove changes nothing
    time.sleep(0.1)
    assert len(c.events("removed", device=NVME)) == 1


def test_vanished_device_without_udev_is_found_by_the_health_poll(harness):
    c = healthy_nvme(harness, health_poll_ms=50)
    harness.fake.remove_device(NVME)
    assert c.wait_state(NVME, "REMOVED")["cause"] == "vanished"


def test_readd_after_removal_is_a_new_device(harness):
    c = healthy_nvme(harness)
    c.ok("remove", {"device": NVME})
    harness.fake.remove_device(NVME)
    harness.add_nvme()
    harness.source.emit("add", NVME)
    c.wait_event("discovered", device=NVME, cause="hot_add")
    deadline = time.monotonic() + TIMEOUT
    while len(c.events("transition", device=NVME, view="health", to="HEALTHY")) < 2:
        assert time.monotonic() < deadline, "the re-added device never became HEALTHY"
        time.sleep(0.01)
    assert not c.events("identity_changed")


def test_a_card_added_while_the_removal_still_ends_is_not_removed_with_it(harness):
    """Under load the slot's power-off write returns late: the kernel removed the old card, the
    next one was added to the same slot and discovered, and only then did the removal end. It
    must end its own record's removal, not the new card's (seen on a loaded 2-core runner)."""
    c = healthy_nvme(harness)
    real_slot_power = harness.svc.sysfs.slot_power

    def the_kernel_removes_and_a_new_card_arrives_before_the_write_returns(slot, on):
        real_slot_power(slot, on)
        harness.fake.remove_device(NVME)
        harness.source.emit("remove", NVME)
        c.wait_state(NVME, "REMOVED")
        harness.add_nvme(serial="SN1")
        harness.source.emit("add", NVME)
        c.wait_event("discovered", device=NVME, cause="hot_add")

    harness.svc.sysfs.slot_power = the_kernel_removes_and_a_new_card_arrives_before_the_write_returns
    assert c.ok("remove", {"device": NVME})["ok"]
    deadline = time.monotonic() + TIMEOUT
    while len(c.events("transition", device=NVME, view="health", to="HEALTHY")) < 2:
        assert time.monotonic() < deadline, "the card added during the removal's end never became HEALTHY"
        time.sleep(0.01)
    assert len(c.events("removed", device=NVME)) == 1
    assert [d["device"] for d in c.ok("inventory")["devices"]] == [NVME]


# --- requested reset (RST-01) -------------------------------------------------------------------
def test_requested_reset_of_a_healthy_device(harness):
    c = healthy_nvme(harness)
    result = c.ok("reset", {"device": NVME})
    assert result["outcome"] == "ok" and result["checkpoint"]["ok"]
    assert c.ok("device", {"device": NVME})["state"] == "HEALTHY"
    lease = c.ok("allocate", {"device": NVME})
    assert c.call("reset", {"device": NVME})["error"]["code"] == protocol.DEVICE_BUSY
    assert c.ok("reset", {"device": NVME, "force": True})["outcome"] == "ok"
    assert c.wait_event("deallocate", device=NVME)["lease"] == lease["lease"]
    assert c.ok("device", {"device": NVME})["state"] == "HEALTHY"
    assert c.ok("leases")["leases"] == []


def test_reset_without_a_reset_method_is_reported_unsupported(harness):
    harness.add_nvme(reset_method=None)
    harness.start()
    c = harness.client()
    c.wait_state(NVME, "HEALTHY")
    assert c.ok("reset", {"device": NVME})["outcome"] == "unsupported"
    assert c.ok("device", {"device": NVME})["state"] == "HEALTHY"


def test_a_different_device_in_the_same_slot_is_flagged(harness):
    c = healthy_nvme(harness)
    harness.fake.remove_device(NVME)
    harness.source.emit("remove", NVME)  # surprise: the location keeps its old identity
    c.wait_state(NVME, "REMOVED")
    harness.add_nvme(serial="OTHER-SERIAL")
    harness.source.emit("add", NVME)
    changed = c.wait_event("identity_changed", device=NVME)
    assert changed["location"] == "slot:1"
    assert c.ok("device", {"device": NVME})["identity_changed"] is True


@pytest.mark.parametrize("driver", ["nvme", None])
def test_bar_claimed_by_a_driver_is_checked_indirectly(harness, driver, monkeypatch):
    monkeypatch.setattr(Sysfs, "read_mmio", lambda *a, **k: None)  # IO_STRICT_DEVMEM refuses the mmap
    harness.add_nvme(driver=driver)
    harness.start()
    c = harness.client()
    c.wait_event("procedure", procedure="hot_add", step="end")
    mmio = c.events("procedure", procedure="hot_add", step="mmio")[0]
    if driver:
        assert mmio["status"] == "ok" and mmio["method"] == "indirect" and mmio["driver"] == "nvme"
    else:
        assert mmio["status"] == "failed" and "no driver bound" in mmio["error"]


def test_recover_of_a_faulted_device_reruns_the_whole_self_check(harness):
    harness.add_nvme(firmware="0.9")
    harness.start(firmware={"1b36:0010": "1.0"})
    c = harness.client()
    c.wait_state(NVME, "FAULTED")
    result = c.ok("recover", {"device": NVME})
    assert result == {"recovered": False, "failed_step": "firmware", "detail": result["detail"]}
    assert c.ok("device", {"device": NVME})["state"] == "FAULTED"
    assert c.wait_event("reset", device=NVME, source="recover")["outcome"] == "ok"


# --- recover of a device whose link reset cleared its config (LIFE-01) ---------------------------
def cleared_nvme_config(command: int = 0x0000) -> bytes:
    """The nvme-like config after a secondary bus reset no driver repaired: BARs and Command 0."""
    b = ConfigBuilder(command=command)
    b.pm()
    b.msix(65)
    b.pcie(port_type=0, flr=True, link_cap=(1, 1), link_status=(1, 1))
    return b.build()


def test_restore_writes_back_the_assigned_bars_and_turns_decoding_on(tmp_path):
    fake = FakeSysfs(tmp_path)
    bdf = "0000:01:00.0"
    config = bytearray(cleared_nvme_config())
    struct.pack_into("<II", config, 0x10, 0x0000000C, 0)  # a 64-bit prefetchable BAR0, address lost
    struct.pack_into("<I", config, 0x18, 0x00000001)  # an I/O BAR2, address lost
    fake.add_device(bdf, bytes(config), resource=[mem_bar(0xFEA0000000, 0x1000000, prefetch=True),
                                                  (0, 0, 0), io_bar(0xC000, 0x100)])
    status, detail = procedures.restore_assigned_config(fake.sysfs, bdf)
    assert status == "ok", detail
    assert detail["bars_lost"] == [0, 2]
    raw = (fake.device_dir(bdf) / "config").read_bytes()
    assert struct.unpack_from("<III", raw, 0x10) == (0xA000000C, 0xFE, 0xC001)
    assert struct.unpack_from("<H", raw, 4)[0] & 0x3 == 0x3  # memory and I/O decoding back on


def test_restore_leaves_an_intact_or_absent_config_alone(tmp_path):
    fake = FakeSysfs(tmp_path)
    intact, absent = "0000:01:00.0", "0000:02:00.0"
    fake.add_device(intact, resource=[mem_bar(0xFE000000, 0x4000)])
    fake.add_device(absent, b"\xff" * 64, resource=[mem_bar(0xFD000000, 0x4000)])
    before = (fake.device_dir(intact) / "config").read_bytes()
    assert procedures.restore_assigned_config(fake.sysfs, intact)[0] == "skipped"
    assert (fake.device_dir(intact) / "config").read_bytes() == before
    assert procedures.restore_assigned_config(fake.sysfs, absent)[0] == "skipped"


def test_restore_leaves_decoding_off_where_the_kernel_never_enabled_the_device(tmp_path):
    fake = FakeSysfs(tmp_path)
    bdf = "0000:01:00.0"
    fake.add_device(bdf, cleared_nvme_config(), resource=[mem_bar(0xFE000000, 0x4000, mem64=False)])
    fake.set_attr(bdf, "enable", "0")
    assert procedures.restore_assigned_config(fake.sysfs, bdf)[0] == "ok"
    raw = (fake.device_dir(bdf) / "config").read_bytes()
    assert struct.unpack_from("<I", raw, 0x10)[0] == 0xFE000000
    assert struct.unpack_from("<H", raw, 4)[0] & 0x2 == 0


def test_recover_of_a_device_whose_link_reset_cleared_its_config_writes_it_back(harness):
    c = healthy_nvme(harness)
    harness.fake.set_config(NVME, cleared_nvme_config())  # the fatal error's link reset, no slot_reset
    c.ok("health_poll", {"device": NVME})
    c.wait_state(NVME, "FAULTED")
    result = c.ok("recover", {"device": NVME})
    assert result["recovered"] is True, result
    restore = c.events("procedure", procedure="recover", step="config_restore")[0]
    assert restore["status"] == "ok" and restore["bars_lost"] == [0]
    assert c.ok("device", {"device": NVME})["state"] == "HEALTHY"
    assert command_register(harness, NVME) & 0x2
