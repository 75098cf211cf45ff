"""Both host kinds conform to the typed protocols, and `get` hands out only what a host declares.

A host that lists a capability must have the protocol's methods for it (no method that
only skips), each declared (`@action`) for one of that protocol's capabilities, and
asking for one it lacks is an error naming the host and the capability.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

import pytest

from hilconform.emulators.faults import FaultInjector
from hilconform.emulators.host_action import declared_actions
from hilconform.emulators.profile import load_profile
from hilconform.fixtures.capabilities import vocabulary
from hilconform.fixtures.host import EmulatedHost
from hilconform.fixtures.host_protocol import (
    CAPABILITY_PROTOCOLS,
    AerInjection,
    CapabilityMissing,
    Host,
    HotPlug,
    Reboot,
    Reset,
)
from hilconform.fixtures.real_host import RealHost

SKIP_TRAPS = ("vm", "workload", "reboot", "faults", "slot_bdf", "populated_slots")  # once skip-only


def members(protocol: type) -> set[str]:
    own = vars(protocol)
    return {n for n in own if not n.startswith("_")} | set(own.get("__annotations__", {}))


def emulated(profile: str = "a100", allow_reboot: bool = False) -> EmulatedHost:
    vm = SimpleNamespace(
        profile=load_profile(profile), allow_reboot=allow_reboot, qemu_version="7.2.22", accel="tcg"
    )
    return EmulatedHost(vm, name=profile)


def real(tmp_path, surveyed: dict) -> RealHost:
    host = RealHost(SimpleNamespace(description="fake"), None, False, tmp_path / "journal.jsonl", "fake")
    host.initial = {"capabilities": surveyed, "kernel": "6.1"}
    return host


def offered_protocols(host) -> set[type]:
    table = vocabulary()
    return {CAPABILITY_PROTOCOLS[table[c].protocol] for c in host.capabilities if table[c].protocol}


def test_each_host_has_the_core_and_every_protocol_it_declares(tmp_path):
    everything = dict.fromkeys(("sysfs-remove", "reset", "aer-inject", "nvml"), True)
    for host in (emulated(), emulated("a100-stock", allow_reboot=True), real(tmp_path, everything)):
        for protocol in {Host} | offered_protocols(host):
            provider = host if protocol is Host else host.get(protocol)
            for name in members(protocol):
                inspect.getattr_static(provider, name)  # AttributeError: it does not conform


def test_every_method_of_a_capability_protocol_is_an_action_declaring_one_of_its_capabilities():
    """The declaration on the method is what `get`, the Allure steps and the docs read: a
    protocol method that is not declared would be served by nobody, or by the wrong backend."""
    table = vocabulary()
    for backend in (FaultInjector, EmulatedHost, RealHost):
        actions = declared_actions(backend)
        for name in set().union(*actions.values()):
            protocol_name = table[name].protocol
            if protocol_name is None:
                continue
            family = {c for c, entry in table.items() if entry.protocol == protocol_name}
            for method in members(CAPABILITY_PROTOCOLS[protocol_name]):
                assert method in actions, f"{backend.__name__}.{method} ({protocol_name}) is not an action"
                assert actions[method] & family, (f"{backend.__name__}.{method} declares "
                                                  f"{sorted(actions[method])}, none of {protocol_name}'s")


def test_every_public_method_that_changes_a_vm_is_an_allure_step():
    """The old hand-kept list of fault actions missed four (fall_off_bus, mismatch_firmware,
    delay_reset_ready, restore_model_faults): now a method is a step because it is declared."""
    queries = {"capabilities", "slot_capabilities", "require", "model_registers", "workload", "vm"}
    public = {n for n in dir(FaultInjector) if not n.startswith("_")} - queries
    undeclared = public - declared_actions(FaultInjector).keys()
    assert not undeclared, sorted(undeclared)


def test_a_real_host_offers_no_method_it_cannot_do(tmp_path):
    host = real(tmp_path, dict.fromkeys(("sysfs-remove", "reset", "aer-inject"), True))
    assert offered_protocols(host) == {HotPlug, AerInjection, Reset}
    for name in SKIP_TRAPS:
        assert not hasattr(RealHost, name), f"RealHost.{name} is back"


def test_get_returns_the_provider_or_names_what_is_missing(tmp_path):
    host = emulated("a100-stock")
    assert host.get("aer-fatal") is host.faults and host.get(HotPlug) is host.faults
    assert host.get("qmp") is host and host.get("kubelet-stand-in") is host
    with pytest.raises(CapabilityMissing, match=r"host emulated:a100-stock .* lacks capability 'nvml'"):
        host.get("nvml")
    with pytest.raises(CapabilityMissing, match="offers no capability of Reboot"):
        host.get(Reboot)
    assert emulated("a100-stock", allow_reboot=True).get(Reboot).reboot
    lab = real(tmp_path, {"aer-inject": True})
    assert lab.get(AerInjection) is lab and lab.get("real-host") is lab
    with pytest.raises(CapabilityMissing, match=r"host real:fake .* lacks capability 'qmp'"):
        lab.get("qmp")
    with pytest.raises(CapabilityMissing, match=r"host real:fake .* offers no capability of Reset"):
        lab.get(Reset)


def test_a_real_hosts_aer_injection_keeps_the_severity_apart(tmp_path):
    lab = real(tmp_path, {"aer-inject": True})
    with pytest.raises(ValueError, match="fatal error"):
        lab.aer_nonfatal("0000:3b:00.0", "DLP")
    with pytest.raises(ValueError, match="not a fatal error"):
        lab.aer_fatal("0000:3b:00.0", "UNSUP")


def test_an_emulated_restart_with_overrides_rewrites_the_guests_config(tmp_path):
    from hilconform.emulators.errors import InfrastructureError
    from hilconform.emulators.runtime_config import runtime_config_for
    from hilconform.emulators.vm import EmulatedVM

    host = emulated("a100-stock")
    scripts, guest_files = [], {}
    host.vm.layout = SimpleNamespace(guest_share=tmp_path)
    host.vm.runtime_config = runtime_config_for(host.profile)
    for method in ("update_run_share", "_put_in_share", "copy_share_file_to_guest"):
        setattr(host.vm, method, functools.partial(getattr(EmulatedVM, method), host.vm))
    host.vm.agent = SimpleNamespace(
        shell=lambda script, timeout_s: scripts.append(script) or SimpleNamespace(exit_code=0, stderr=""),
        write_file=lambda path, data, mode: guest_files.update({path: data}),
    )
    host.restart_runtime({"lease_ttl_s": 2.0})
    host.restart_runtime({"lease_ttl_s": 3.0})  # a second change starts again from the profile's config
    wanted = runtime_config_for(host.profile, {"lease_ttl_s": 3.0})
    assert (tmp_path / "runtime.toml").read_text() == wanted  # the share, for a reboot
    assert guest_files == {"/opt/hilconform/run/runtime.toml": wanted.encode()}  # the guest's copy, now
    assert len(scripts) == 2
    host.vm.runtime_config = "name = 'a config of its own'\n"
    with pytest.raises(InfrastructureError, match="runtime config of its own"):
        host.restart_runtime({"lease_ttl_s": 2.0})


def test_hot_plug_records_are_read_on_their_own_clock():
    from hilconform.emulators.hotplug_records import HotAdd, Removal
    from hilconform.fixtures.host_protocol import NodeAction, ms_to_event

    event = {"host_ns": 5_000_000_000, "ts_ns": 9_000_000_000}  # controller and node clocks differ
    assert ms_to_event(NodeAction("0000:3b:00.0", 8_750_000_000), event) == 250.0  # node: ts_ns
    assert ms_to_event(Removal("gpu0", 4_900_000_000, 4_950_000_000), event) == 100.0  # controller
    assert ms_to_event(HotAdd("spare0", "spare0-nvme", "0000:05:00.0", 4_800_000_000), event) == 200.0
    with pytest.raises(TypeError, match="no request time"):
        ms_to_event(object(), event)


def test_a_real_hosts_targets_are_its_safe_selected_devices(tmp_path):
    from hilconform.fixtures.real_safety import SafetyPolicy, UnsafeTarget

    lab = real(tmp_path, {"aer-inject": True})
    lab.allow_destructive = True
    lab.profile = SimpleNamespace(name="a100")
    selected = frozenset({"0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0"})
    lab.policy = SafetyPolicy(True, selected, {"0000:86:00.0": ["holds the root file system"]})
    lab.survey = lambda: {"devices": dict.fromkeys(selected, {})}
    assert lab.targets("aer-fatal") == ["0000:3b:00.0", "0000:5e:00.0"]
    assert lab.target_bdf("0000:5e:00.0") == "0000:5e:00.0"
    with pytest.raises(UnsafeTarget, match="not a device profile a100 selects"):
        lab.target_bdf("0000:00:02.0")
    with pytest.raises(CapabilityMissing, match="lacks capability 'reset'"):
        lab.targets("reset")
