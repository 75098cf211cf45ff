"""A host restored from a saved ready VM is, to the suites, the host a boot gives (issue 17).

On the device-model hosts (a100; mixed, with the U250 and T4 models; QEMU 11.1: migratable):
one host booted plainly (a100), one booted and saved (the first of its configuration), and one
restored from that save. All of them must show the
same ground truth (QEMU's query-pci), the same guest view (lspci with the config space's first
bytes, the read-only root, the code run from tmpfs), and the same runtime state: every device with
the same BDF, fingerprint, identity, states, info and pool membership; no lease, no holder. A
restored guest's wall clock is the host's. A host with a changed runtime config is the profile's
saved VM with its runtime restarted on the change. The stock host is restored exactly when its
QEMU can migrate it (QEMU 7.2's nvme cannot: it boots, and the reason is QEMU's).
"""

from __future__ import annotations

import time

import pytest

from hilconform.emulators import vm_snapshot
from hilconform.emulators.pci_inventory import query_pci
from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.emulators.vm import EmulatedVM
from hilconform.fixtures.fresh_host import start_from_saved, why_booted
from hilconform.fixtures.host import EmulatedHost

# Fields of a runtime's device record that say when, not what (a restored runtime ran on).
WHEN_FIELDS = ("since_ns",)
GUEST_VIEW = ("lspci -D -n -xxxx;"  # every function and its whole config space
              " findmnt -n -o TARGET,FSTYPE,OPTIONS / /opt/hilconform/src /opt/hilconform/run;"
              " cat /proc/cmdline; ls /var/lib/kubelet; cat /run/hilconform/identities.json")


def _host(profile_name: str, restoring: bool, overrides: dict | None = None,
          config: str | None = None) -> EmulatedHost:
    profile = load_profile(profile_name)
    host = EmulatedHost(EmulatedVM(profile, runtime_config=config or runtime_config_for(profile, overrides)),
                        name=profile.name, _overrides=overrides)
    if restoring:
        start_from_saved(host)
    else:
        host.vm.start()
    return host


def _quiet_inventory(host: EmulatedHost, timeout_s: float = 60) -> list[dict]:
    """The runtime's devices once cold discovery and every orderly add are done."""
    deadline = time.monotonic() + timeout_s
    host.settled_inventory(timeout_s=timeout_s)
    while True:
        devices = host.runtime.call("inventory")["devices"]
        if not any(d["busy"] for d in devices) or time.monotonic() > deadline:
            return [{k: v for k, v in d.items() if k not in WHEN_FIELDS} for d in devices]
        time.sleep(0.1)


def _view(host: EmulatedHost) -> dict:
    runtime = _quiet_inventory(host)
    result = host.shell(GUEST_VIEW, timeout_s=60)
    assert result.exit_code == 0, result.stderr
    return {"ground_truth": query_pci(host.vm.qmp), "guest": result.stdout, "runtime": runtime}


@pytest.fixture
def own_saved_vms(monkeypatch):
    """Saved VMs of this test only (others' saves would make the first host a restore)."""
    saved = vm_snapshot.SavedVMs()
    monkeypatch.setattr(vm_snapshot, "_process_saved", saved)
    yield saved
    saved.clear()


# a100: a plain boot, the first host (booted and saved) and a restored one; mixed (the Alveo U250
# and T4 models): the saved host and the restored one (the plain boot proved on a100 that a save
# leaves its host as a boot does; ~16 s less).
@pytest.mark.parametrize("profile, plain_boot", [
    ("a100", True),
    pytest.param("mixed", False, marks=pytest.mark.extended),  # a second model profile: make test-extended
], ids=["a100", "mixed"])
def test_a_restored_model_host_is_the_host_a_boot_gives(own_saved_vms, profile, plain_boot):
    expected = None
    if plain_boot:
        booted = _host(profile, restoring=False)
        try:
            expected = _view(booted)
        finally:
            booted.close()

    first = _host(profile, restoring=True)  # the first of its configuration: booted, then saved
    try:
        assert first.vm.made_by == "boot" and why_booted() == {}
        if expected is None:
            expected = _view(first)
        else:
            assert _view(first) == expected  # the save left it as it was
    finally:
        first.close()
    assert expected["runtime"] and all(d["state"] == "HEALTHY" for d in expected["runtime"])

    requested = time.monotonic()
    restored = _host(profile, restoring=True)
    try:
        restored.settled_inventory()
        took_s = time.monotonic() - requested
        assert restored.vm.made_by == "restore"
        assert _view(restored) == expected
        guest_now_ns = restored.vm.agent.call("guest-get-time")
        assert abs(guest_now_ns - time.time_ns()) < 2e9, "the restored guest's wall clock was not set"
    finally:
        restored.close()
    print(f"restored host: request -> inventory complete {took_s:.2f} s")

    # A host whose runtime config changes a key of the profile's: the profile's saved VM restored
    # and its runtime restarted with the change, which reaches the guest through the agent.
    changed = _host(profile, restoring=True, overrides={"lease_ttl_s": 7.0})
    try:
        assert changed.vm.made_by == "restore" and changed.runtime_overrides == {"lease_ttl_s": 7.0}
        config = changed.shell("cat /opt/hilconform/run/runtime.toml").stdout
        assert "lease_ttl_s = 7.0" in config
        runtime = _quiet_inventory(changed)
        assert [d["fingerprint"] for d in runtime] == [d["fingerprint"] for d in expected["runtime"]]
        assert all(d["state"] == "HEALTHY" for d in runtime)
    finally:
        changed.close()

    # A host with a whole runtime config of its own (as LIFE-05's AER policy): the same, with
    # that config's text, not the profile's with overrides.
    own = "# this test's own config\n" + runtime_config_for(load_profile(profile), {"lease_ttl_s": 9.0})
    mine = _host(profile, restoring=True, config=own)
    try:
        assert mine.vm.made_by == "restore" and mine.vm.runtime_config == own
        assert mine.shell("cat /opt/hilconform/run/runtime.toml").stdout == own
        runtime = _quiet_inventory(mine)
        assert [d["fingerprint"] for d in runtime] == [d["fingerprint"] for d in expected["runtime"]]
        assert all(d["state"] == "HEALTHY" for d in runtime)
    finally:
        mine.close()


@pytest.mark.extended  # the stock variant's hosts: make test-extended, with its suites
def test_a_stock_host_is_restored_exactly_when_its_qemu_can_migrate_it(own_saved_vms):
    """Debian 12's QEMU 7.2 marks its nvme non-migratable: the stock host boots each time and QEMU's
    reason is kept. A QEMU that migrates nvme (11.1 does) restores it like any other host."""
    host = _host("a100-stock", restoring=True)
    try:
        assert host.vm.made_by == "boot"
        reasons = list(why_booted().values())
    finally:
        host.close()
    again = _host("a100-stock", restoring=True)
    try:
        if reasons:
            assert len(reasons) == 1 and "nvme" in reasons[0], reasons
            assert again.vm.made_by == "boot"  # no save is tried again for that configuration
        else:
            assert again.vm.made_by == "restore"
            assert all(d["state"] == "HEALTHY" for d in _quiet_inventory(again))
    finally:
        again.close()
