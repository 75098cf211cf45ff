"""Smoke suite: the emulated host boots, its inventory is what the profile says,
and hot-plug works both ways in both hot-plug modes. No runtime involved yet:
these prove the ground the conformance suites stand on.
"""

from __future__ import annotations

import pytest

from hilconform.fixtures.host_protocol import HotPlug

INFRA_QDEV_IDS = {"vser"}


@pytest.mark.needs("qmp")
def test_guest_boots_with_the_image_kernel(host):
    assert host.kernel_release() == host.get("qmp").image_kernel_version()


@pytest.mark.needs("qmp")
def test_guest_lspci_matches_qmp_query_pci(host):
    qemu = {f.key() for f in host.ground_truth()}
    guest = {f.key() for f in host.guest_pci()}
    assert guest == qemu, (
        f"only QEMU has {sorted(qemu - guest)}; only the guest has {sorted(guest - qemu)}"
    )


@pytest.mark.needs("qmp")  # QEMU's bus tree against the profile's slots
def test_inventory_matches_profile(host):
    truth = host.ground_truth()
    by_qdev = {f.qdev_id: f for f in truth if f.qdev_id}
    for slot in host.profile.slots:
        port = by_qdev.get(slot.port_id)
        assert port is not None, f"root port {slot.port_id} missing"
        below = [f for f in truth if f.bdf.startswith(f"0000:{port.secondary_bus:02x}:")]
        if slot.populated:
            kind = host.profile.kind(slot.device)
            assert [f.ids for f in below] == [f"{kind.vendor}:{kind.device}"], slot.name
            assert below[0].qdev_id == slot.name
        else:
            assert below == [], f"empty slot {slot.name} holds {below}"


def _empty_slot(host):
    empty = [s for s in host.profile.slots if not s.populated]
    if not empty:
        pytest.skip(f"profile {host.profile.name} has no empty hot-plug slot")
    return empty[0]


@pytest.mark.destructive
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["native", "acpi"])
@pytest.mark.needs("hot-add", "qmp")
def test_hot_add_then_remove(host_factory, mode):
    host = host_factory.fresh(hotplug_mode=mode)
    slot = _empty_slot(host)
    added = host.get(HotPlug).hot_add(slot.name)
    assert host.get(HotPlug).guest_has_device(added.bdf, timeout_s=20), (
        f"guest never showed {added.bdf} after device_add into {slot.name}"
    )
    kind = host.profile.kind(slot.accepts)
    ids = host.shell(f"cat /sys/bus/pci/devices/{added.bdf}/vendor "
                     f"/sys/bus/pci/devices/{added.bdf}/device").check().stdout.split()
    assert ids == [f"0x{kind.vendor}", f"0x{kind.device}"]

    removal = host.get(HotPlug).remove(added.device_id)
    assert removal.verified_ns > removal.requested_ns
    gone = host.shell(f"test -e /sys/bus/pci/devices/{added.bdf}").exit_code
    assert gone != 0, f"{added.bdf} still present in the guest after DEVICE_DELETED"
    assert added.device_id not in {f.qdev_id for f in host.ground_truth()}
