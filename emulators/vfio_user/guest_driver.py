"""The Linux driver the lab's stack would bind to a device model, bound in the emulated guest.

Why: on a lab host a driver with AER error handlers holds the card (nvidia.ko, or vfio-pci
under OPAE/XRT/DPDK), so the kernel recovers it from AER errors and lspci names the driver.
A model names that driver (`guest_driver` in its TOML; the drivers are data in
guest_drivers.toml). This module turns a profile's models into the run-share file the guest
init hands to vm-images/guest-drivers.sh (which loads the modules and binds the cold-plugged
cards before the runtime starts, and installs a udev rule that binds hot-added ones), adds
the emulated IOMMU a driver needs to QEMU's command line, and checks after boot that each
cold-plugged model has its driver (a card left unbound is a broken test bed, not a finding).
"""

from __future__ import annotations

import json

from ..errors import InfrastructureError
from ..pci_inventory import function_below, query_pci
from .driver_table import GuestDriver, guest_drivers, iommu
from .model import load_model

SHARE_FILE = "guest-drivers"  # in the VM's run share, read by vm-images/guest-drivers.sh
CHECK_TIMEOUT_S = 20.0


def drivers_by_ids(profile) -> dict[str, GuestDriver]:
    """"vvvv:dddd" → driver, for every model the profile cold-plugs or accepts that names one."""
    out: dict[str, GuestDriver] = {}
    for slot in profile.slots:
        for kind_name in (slot.device, slot.accepts):
            kind = profile.kinds.get(kind_name)
            if kind is None or not kind.model:
                continue
            model = load_model(kind.model)
            if model.guest_driver is not None:
                out[model.ids] = guest_drivers()[model.guest_driver]
    return out


def share_text(profile) -> str | None:
    """The run-share file: `module NAME [OPTION...]` lines, then `bind VENDOR DEVICE DRIVER`."""
    drivers = drivers_by_ids(profile)
    if not drivers:
        return None
    lines = ["# guest drivers of this host's device models (emulators/vfio_user/guest_driver.py)"]
    modules: list[tuple[str, ...]] = []
    for driver in drivers.values():
        modules += [m for m in driver.modules if m not in modules]
    lines += ["module " + " ".join(m) for m in modules]
    lines += [f"bind {ids.replace(':', ' ')} {driver.name}" for ids, driver in sorted(drivers.items())]
    return "\n".join(lines) + "\n"


def with_iommu(argv: list[str], profile) -> list[str]:
    """QEMU's argv with the emulated IOMMU (before the first -device) and its kernel
    arguments, when a driver the guest binds needs one; else argv unchanged."""
    if not any(d.needs_iommu for d in drivers_by_ids(profile).values()):
        return argv
    table = iommu()
    out = list(argv)
    try:
        append = out.index("-append") + 1
        first_device = out.index("-device")
    except ValueError:
        raise InfrastructureError("guest driver: QEMU's argv has no -append or no -device") from None
    out[append] = " ".join([out[append], *table["kernel_args"]])
    out[first_device:first_device] = ["-device", json.dumps(table["device"], separators=(",", ":"))]
    return out


def bound_driver(vm, bdf: str) -> str | None:
    """The driver bound to `bdf` in the guest (the sysfs `driver` link), None if none."""
    result = vm.agent.run(["readlink", f"/sys/bus/pci/devices/{bdf}/driver"], timeout_s=CHECK_TIMEOUT_S)
    return result.stdout.strip().rsplit("/", 1)[-1] if result.exit_code == 0 else None


def check_bound(vm) -> dict[str, str]:
    """After boot: every cold-plugged model that names a driver has it bound ({bdf: driver});
    raises InfrastructureError naming the device and quoting the guest's lines otherwise."""
    drivers = drivers_by_ids(vm.profile)
    if not drivers:
        return {}
    functions = query_pci(vm.qmp)
    bound: dict[str, str] = {}
    for slot in vm.profile.slots:
        kind = vm.profile.kinds.get(slot.device)
        if not slot.populated or kind is None or f"{kind.vendor}:{kind.device}" not in drivers:
            continue
        want = drivers[f"{kind.vendor}:{kind.device}"].name
        bdf = function_below(functions, slot.port_id)
        have = bound_driver(vm, bdf) if bdf else None
        if have != want:
            lines = [ln for ln in vm.console_log().splitlines() if "guest-drivers" in ln or "vfio" in ln]
            raise InfrastructureError(
                f"guest driver: {want} is not bound to slot {slot.name}'s model {kind.model} at {bdf} "
                f"(bound: {have}); guest lines:\n" + "\n".join(lines[-20:]))
        bound[bdf] = have
    return bound
