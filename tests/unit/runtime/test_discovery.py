"""Selector, cold enumeration and batched change delivery (DISC-01, DISC-03, DISC-04, DISC-06)."""

from __future__ import annotations

import threading
import time

import pytest
from fakesysfs import ConfigBuilder, FakeSysfs, edu_config, nvme_config, root_port_config

from hilconform.runtime.discovery import (
    DiscoveryWatcher,
    PciChange,
    QueueChangeSource,
    change_from_uevent,
)
from hilconform.runtime.selector import Selector

WINDOW = 0.1  # short batching window keeps the tests fast; bounds below are generous
SELECT = Selector(classes=("0108", "00ff"), ids=("8086:10d3",))


# --- selector -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "vendor, device, klass, expected",
    [
        (0x1B36, 0x0010, 0x010802, True),  # nvme by class prefix
        (0x1234, 0x11E8, 0x00FF00, True),  # edu by class
        (0x8086, 0x10D3, 0x020000, True),  # e1000e by ID
        (0x1AF4, 0x1041, 0x020000, False),
        (0x1B36, 0x000C, 0x060400, False),  # root port
    ],
)
def test_selector_matches(vendor, device, klass, expected):
    assert SELECT.matches(vendor, device, klass) is expected


def test_selector_vendor_wildcard_and_any_class():
    assert Selector(ids=("10de:*",)).matches(0x10DE, 0x20B0, 0x030200)
    assert not Selector(ids=("10de:*",)).matches(0x1002, 0x20B0, 0x030200)
    assert Selector(classes=("*",)).matches(1, 2, 3)
    assert not Selector().matches(0x10DE, 0x20B0, 0x030200)


def test_selector_from_config():
    sel = Selector.from_config({"classes": ["0108", "0302"], "ids": ["1B36:0010"]})
    assert sel == Selector(classes=("0108", "0302"), ids=("1b36:0010",))


@pytest.mark.parametrize(
    "table, message",
    [
        ({"class": ["0108"]}, "'class'"),
        ({"classes": "0108"}, "'classes'"),
        ({"classes": ["01x8"]}, "'classes'"),
        ({"classes": ["010"]}, "'classes'"),
        ({"ids": ["1b36-0010"]}, "'ids'"),
        ({"ids": [0x1B36]}, "'ids'"),
        ({}, "'classes' and/or 'ids'"),
    ],
)
def test_selector_from_config_rejects_bad_tables(table, message):
    with pytest.raises(ValueError, match=message):
        Selector.from_config(table)


# --- enumeration ------------------------------------------------------------------------------
@pytest.fixture
def fake(tmp_path):
    f = FakeSysfs(tmp_path)
    f.add_device("0000:00:10.0", root_port_config())
    f.add_device("0000:01:00.0", nvme_config(), parent="0000:00:10.0", nvme_serial="A", driver="nvme")
    f.add_device("0000:00:05.0", edu_config())
    f.add_device("0000:00:03.0", ConfigBuilder(vendor=0x1AF4, device=0x1041, class_code=0x020000).build())
    return f


def _watcher(fake, batches, source=None, window=WINDOW, **kwargs):
    return DiscoveryWatcher(
        fake.sysfs, SELECT, window, batches.append, source or QueueChangeSource(), **kwargs
    )


def test_enumerate_reports_selected_devices_only(fake):
    infos = _watcher(fake, []).enumerate()
    assert [(i.bdf, i.ids) for i in infos] == [
        ("0000:00:05.0", "1234:11e8"),
        ("0000:01:00.0", "1b36:0010"),
    ]
    assert infos[1].serial == "A"


# --- batching -----------------------------------------------------------------------------------
def _collect(watcher, batches, count, timeout=5.0):
    deadline = time.monotonic() + timeout
    while len(batches) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return batches


def test_storm_within_window_is_one_batch(fake):
    batches, source = [], QueueChangeSource()
    bdfs = [f"0000:0{i}:00.0" for i in range(2, 8)]
    for bdf in bdfs:
        fake.add_device(bdf, nvme_config())
    watcher = _watcher(fake, batches, source, window=0.3)
    watcher.start()
    try:
        for bdf in bdfs:
            source.emit("add", bdf)
            time.sleep(0.01)
        _collect(watcher, batches, 1)
        time.sleep(0.4)  # nothing else may arrive
    finally:
        watcher.stop()
    assert len(batches) == 1
    assert [c.bdf for c in batches[0]] == bdfs and {c.action for c in batches[0]} == {"add"}


def test_changes_apart_are_separate_batches(fake):
    batches, source = [], QueueChangeSource()
    watcher = _watcher(fake, batches, source)
    watcher.start()
    try:
        source.emit("add", "0000:01:00.0")
        time.sleep(3 * WINDOW)
        source.emit("change", "0000:00:05.0", ERROR_EVENT="BEGIN_RECOVERY", DEVICE_ONLINE="0")
        _collect(watcher, batches, 2)
    finally:
        watcher.stop()
    assert [[c.action for c in b] for b in batches] == [["add"], ["change"]]
    assert batches[1][0].properties == {"ERROR_EVENT": "BEGIN_RECOVERY", "DEVICE_ONLINE": "0"}


def test_batch_closes_one_window_after_its_first_change(fake):
    """Fixed window: a lone change waits ~window_s at most; a trickle cannot hold a batch open."""
    delivered, source = [], QueueChangeSource()

    def on_batch(batch):
        delivered.append((time.monotonic_ns(), batch))

    watcher = DiscoveryWatcher(fake.sysfs, SELECT, 0.2, on_batch, source)
    watcher.start()
    try:
        first = source.emit("add", "0000:01:00.0")
        for _ in range(8):  # a change every 50 ms for 400 ms
            time.sleep(0.05)
            source.emit("change", "0000:01:00.0")
        _collect(watcher, delivered, 2)
        time.sleep(0.3)
    finally:
        watcher.stop()
    first_delay_s = (delivered[0][0] - first.received_ns) / 1e9
    assert 0.15 <= first_delay_s < 1.0
    assert len(delivered) >= 2  # not one ever-growing batch
    assert sum(len(b) for _, b in delivered) == 9


def test_on_change_is_called_at_once(fake):
    seen, batches, source = [], [], QueueChangeSource()
    watcher = _watcher(
        fake, batches, source, window=1.0, on_change=lambda c: seen.append(time.monotonic_ns())
    )
    watcher.start()
    try:
        change = source.emit("add", "0000:01:00.0")
        deadline = time.monotonic() + 2
        while not seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert seen and not batches
        assert (seen[0] - change.received_ns) / 1e9 < 0.5
    finally:
        watcher.stop()


def test_a_storm_is_read_as_it_comes_while_its_changes_are_being_handled(fake):
    """Handling an add takes 150 ms here (a slow description): the reader still reads all six
    adds as they come, so they are one batch, delivered once every add was handled."""
    batches, handled, source = [], [], QueueChangeSource()
    bdfs = [f"0000:0{i}:00.0" for i in range(2, 8)]
    for bdf in bdfs:
        fake.add_device(bdf, nvme_config())

    def slow_describe(change):
        time.sleep(0.15)
        handled.append(change.bdf)

    watcher = _watcher(fake, batches, source, window=0.2, on_change=slow_describe)
    watcher.start()
    try:
        emitted = []
        for bdf in bdfs:
            emitted.append(source.emit("add", bdf))
            time.sleep(0.02)
        _collect(watcher, batches, 1)
        time.sleep(0.3)
    finally:
        watcher.stop()
    assert len(batches) == 1, [[c.bdf for c in b] for b in batches]
    assert [c.bdf for c in batches[0]] == bdfs
    assert sorted(handled) == bdfs  # the batch came after every add was handled


def test_changes_waiting_when_the_window_closes_join_its_batch(fake):
    """The reader was held up (its first read comes after the window has passed): the changes
    that arrived meanwhile are one batch, not one batch each."""
    batches, source = [], QueueChangeSource()
    bdfs = [f"0000:0{i}:00.0" for i in range(2, 6)]
    for bdf in bdfs:
        fake.add_device(bdf, nvme_config())
    first = PciChange("add", bdfs[0], time.monotonic_ns() - 500_000_000)  # read 0.5 s late
    source.put(first)
    for bdf in bdfs[1:]:
        source.emit("add", bdf)
    watcher = _watcher(fake, batches, source, window=0.2)
    watcher.start()
    try:
        _collect(watcher, batches, 1)
        time.sleep(0.3)
    finally:
        watcher.stop()
    assert [[c.bdf for c in b] for b in batches] == [bdfs]


def test_changes_of_one_device_are_handled_in_order_and_devices_in_parallel(fake):
    source, calls, lock = QueueChangeSource(), [], threading.Lock()

    def on_change(change):
        with lock:
            calls.append(("start", change.bdf, change.action, time.monotonic()))
        time.sleep(0.1)
        with lock:
            calls.append(("end", change.bdf, change.action, time.monotonic()))

    for bdf in ("0000:02:00.0", "0000:03:00.0"):
        fake.add_device(bdf, nvme_config())
    watcher = _watcher(fake, [], source, on_change=on_change, handler_threads=2)
    watcher.start()
    try:
        source.emit("add", "0000:02:00.0")
        source.emit("add", "0000:03:00.0")
        source.emit("remove", "0000:02:00.0")
        deadline = time.monotonic() + 5
        while len(calls) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
    of_02 = [(kind, action) for kind, bdf, action, _ in calls if bdf == "0000:02:00.0"]
    assert of_02 == [("start", "add"), ("end", "add"), ("start", "remove"), ("end", "remove")]
    starts = {(bdf, action): t for kind, bdf, action, t in calls if kind == "start"}
    ends = {(bdf, action): t for kind, bdf, action, t in calls if kind == "end"}
    assert starts[("0000:03:00.0", "add")] < ends[("0000:02:00.0", "add")]  # side by side


def test_look_again_changes_wait_for_adds_and_merge(fake):
    """With one handler busy, two binds and a change of device A queue up behind it; the add
    of device B that arrives after them is served first, and A's three are read once."""
    source, order, gate = QueueChangeSource(), [], threading.Event()
    for bdf in ("0000:02:00.0", "0000:03:00.0", "0000:04:00.0"):
        fake.add_device(bdf, nvme_config())

    def on_change(change):
        if change.bdf == "0000:04:00.0":
            gate.wait(2)
        order.append((change.action, change.bdf))

    watcher = _watcher(fake, [], source, on_change=on_change, handler_threads=1)
    watcher.start()
    try:
        source.emit("add", "0000:04:00.0")  # holds the only handler
        time.sleep(0.05)
        source.emit("bind", "0000:02:00.0")
        source.emit("change", "0000:02:00.0", CHILD_SUBSYSTEM="nvme")
        source.emit("bind", "0000:02:00.0")
        source.emit("add", "0000:03:00.0")
        time.sleep(0.05)
        gate.set()
        deadline = time.monotonic() + 5
        while len(order) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
    finally:
        watcher.stop()
    assert order == [("add", "0000:04:00.0"), ("add", "0000:03:00.0"), ("bind", "0000:02:00.0")]


def test_an_error_report_is_never_merged_into_a_look_again(fake):
    source, seen = QueueChangeSource(), []
    fake.add_device("0000:02:00.0", nvme_config())
    gate = threading.Event()

    def on_change(change):
        gate.wait(2)
        seen.append(change.properties.get("ERROR_EVENT", change.action))

    watcher = _watcher(fake, [], source, on_change=on_change, handler_threads=1)
    watcher.start()
    try:
        source.emit("bind", "0000:02:00.0")  # taken by the handler at once
        time.sleep(0.05)
        source.emit("change", "0000:02:00.0")
        source.emit("change", "0000:02:00.0", ERROR_EVENT="BEGIN_RECOVERY")
        source.emit("change", "0000:02:00.0")
        gate.set()
        deadline = time.monotonic() + 5
        while len(seen) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert seen == ["bind", "change", "BEGIN_RECOVERY", "change"]


def test_no_handler_threads_is_refused(fake):
    with pytest.raises(ValueError, match="handler_threads"):
        _watcher(fake, [], handler_threads=0)


def test_filtering_keeps_removes_of_gone_devices(fake):
    batches, source = [], QueueChangeSource()
    watcher = _watcher(fake, batches, source)
    watcher.enumerate()
    watcher.start()
    try:
        source.emit("change", "0000:00:03.0")  # virtio-net: not selected, dropped
        source.emit("change", "0000:00:10.0")  # root port: not selected, dropped
        fake.remove_device("0000:01:00.0")
        source.emit("remove", "0000:01:00.0")  # known device, gone: delivered
        source.emit("remove", "0000:09:00.0")  # never seen, gone: cannot judge, delivered
        source.emit("add", "0000:0a:00.0")  # added and gone again before we looked: delivered
        _collect(watcher, batches, 1)
    finally:
        watcher.stop()
    assert [(c.action, c.bdf) for c in batches[0]] == [
        ("remove", "0000:01:00.0"),
        ("remove", "0000:09:00.0"),
        ("add", "0000:0a:00.0"),
    ]


def test_callback_errors_do_not_stop_discovery(fake):
    calls, source = [], QueueChangeSource()

    def on_batch(batch):
        calls.append(batch)
        if len(calls) == 1:
            raise RuntimeError("caller bug")

    watcher = DiscoveryWatcher(fake.sysfs, SELECT, 0.02, on_batch, source)
    watcher.start()
    try:
        source.emit("add", "0000:01:00.0")
        _collect(watcher, calls, 1)
        source.emit("add", "0000:00:05.0")
        _collect(watcher, calls, 2)
    finally:
        watcher.stop()
    assert len(calls) == 2 and watcher.callback_errors == 1


def test_stop_ends_the_thread_and_closes_the_source(fake):
    source = QueueChangeSource()
    watcher = _watcher(fake, [], source)
    watcher.start()
    watcher.stop()
    assert not any(t.name == "pci-discovery" for t in threading.enumerate())
    assert source.next(0.01) is None


def test_negative_window_is_refused(fake):
    with pytest.raises(ValueError):
        _watcher(fake, [], window=-1)


# --- uevent mapping -----------------------------------------------------------------------------
def test_change_from_uevent_maps_pci_and_nvme_children():
    pci = change_from_uevent(
        "add",
        "pci",
        "0000:01:00.0",
        "/devices/pci0000:00/0000:00:10.0/0000:01:00.0",
        {"PCI_ID": "1B36:0010"},
        5,
    )
    assert pci == PciChange("add", "0000:01:00.0", 5, {"PCI_ID": "1B36:0010"})
    nvme = change_from_uevent(
        "add", "nvme", "nvme0", "/devices/pci0000:00/0000:00:10.0/0000:01:00.0/nvme/nvme0", {}, 6
    )
    assert (nvme.action, nvme.bdf) == ("change", "0000:01:00.0")
    assert nvme.properties == {
        "CHILD_SUBSYSTEM": "nvme",
        "CHILD_ACTION": "add",
        "CHILD_NAME": "nvme0",
    }
    assert (
        change_from_uevent("add", "nvme", "nvme-fabrics", "/devices/virtual/misc/nvme-fabrics", {}, 7) is None
    )
