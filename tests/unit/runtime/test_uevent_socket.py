"""The kernel uevent source: message parsing, and a real uevent read from netlink with its stamp."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hilconform.runtime.uevent_socket import KernelUeventSource, parse_uevent

ADD = (
    b"add@/devices/pci0000:00/0000:00:10.1/0000:02:00.0\0ACTION=add\0"
    b"DEVPATH=/devices/pci0000:00/0000:00:10.1/0000:02:00.0\0SUBSYSTEM=pci\0"
    b"PCI_CLASS=10802\0PCI_ID=1B36:0010\0PCI_SLOT_NAME=0000:02:00.0\0SEQNUM=1412\0"
)


def test_a_kernel_message_is_parsed_into_action_devpath_and_properties():
    action, devpath, props = parse_uevent(ADD)
    assert action == "add"
    assert devpath == "/devices/pci0000:00/0000:00:10.1/0000:02:00.0"
    assert props["PCI_ID"] == "1B36:0010" and props["SEQNUM"] == "1412"


def test_a_message_without_a_header_is_not_a_uevent():
    assert parse_uevent(b"libudev\0\xfe\xed\xca\xfe") is None


def _pci_uevent_file() -> Path | None:
    for dev in sorted(Path("/sys/bus/pci/devices").glob("*")):
        path = dev / "uevent"
        if os.access(path, os.W_OK):
            return path
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="triggering a kernel uevent needs root")
def test_a_real_kernel_uevent_is_read_from_netlink():
    """Writes "change" to a PCI device's uevent file (the kernel re-announces the device;
    nothing about the device changes) and reads the kernel's message for it."""
    path = _pci_uevent_file()
    if path is None:
        pytest.skip("no writable PCI uevent file on this machine")
    source = KernelUeventSource()
    try:
        sent_ns = time.monotonic_ns()
        path.write_text("change")
        deadline = time.monotonic() + 5
        change = None
        while time.monotonic() < deadline:
            change = source.next(1.0)
            if change is not None and change.bdf == path.parent.name:
                break
        assert change is not None and change.bdf == path.parent.name and change.action == "change"
        assert change.properties["SUBSYSTEM"] == "pci"
        assert change.received_ns >= sent_ns
    finally:
        source.close()
