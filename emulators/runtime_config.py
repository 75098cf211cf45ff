"""The runtime configuration an emulated host hands its guest.

Derived from the host profile (which devices to manage, the firmware the
stand-ins report, the drain and lease budgets), written as TOML into the VM's
`hilconform_run` share, where the guest init finds it and starts the runtime.
Keys are those of runtime/default-config.toml.
"""

from __future__ import annotations

import json
import re

from .profile import HostProfile
from .qemu_command import RUNTIME_PORT_NAME
from .toml_writer import dump_toml, merge_tables
from .vfio_user.model import load_model

GUEST_IDENTITY_STORE = "/run/hilconform/identities.json"


# How long the runtime's hot-add steps wait for the guest kernel (a driver binding, its interrupts
# set up): a TCG guest's nvme driver took over 3 s, the runtime's default, on a loaded runner, and
# the runtime then kept a healthy device out of its pool (a false DP-05 failure). HP-05's failing
# steps fail at once (firmware, all-ones MMIO), so a longer wait costs the suites nothing.
GUEST_HOT_ADD_STEP_TIMEOUT_MS = 15000


def runtime_config_for(profile: HostProfile, overrides: dict | None = None,
                       changes: dict | None = None) -> str:
    """The runtime TOML a VM of `profile` gets: `overrides` change top-level keys (e.g.
    lease_ttl_s), `changes` are merged in table by table (e.g. {"aer": {"fault_weight": 4.0}})."""
    table = merge_tables(runtime_config_table(profile, overrides), changes or {})
    header = (f"Written by hilconform.emulators.runtime_config for profile {profile.name!r}; "
              "do not edit by hand.")
    if changes:
        header += f"\nWith the test's changes {json.dumps(changes)}."
    return dump_toml(table, header)


def runtime_config_table(profile: HostProfile, overrides: dict | None = None) -> dict:
    """The runtime configuration of `profile`, as tables (keys of runtime/default-config.toml)."""
    stand_ins = {profile.kind(s.device if s.populated else s.accepts) for s in profile.slots}
    firmware, expected = {}, {}
    for slot in profile.slots:
        kind = profile.kind(slot.device if slot.populated else slot.accepts)
        if kind.model:  # a model reports its firmware register: expect the slot's or the model's own
            version = slot.firmware_version or str(load_model(kind.model).firmware)
            expected.setdefault(f"{kind.vendor}:{kind.device}", version)
        elif slot.firmware_version:
            firmware.setdefault(f"{kind.vendor}:{kind.device}", slot.firmware_version)
    models = sorted(f"{k.vendor}:{k.device}" for k in stand_ins if k.model)
    table = {
        "name": "hilconform-reference",
        "transport": f"virtio-serial:/dev/virtio-ports/{RUNTIME_PORT_NAME}",
        "identity_store": GUEST_IDENTITY_STORE,
        "drain_timeout_ms": int(profile.budgets.get("drain_timeout_ms", 300)),
        "lease_ttl_s": float(profile.budgets.get("lease_ttl_s", 30)),
        "hot_add_step_timeout_ms": GUEST_HOT_ADD_STEP_TIMEOUT_MS,
    }
    table.update(overrides or {})
    hooks = {"firmware": dict(firmware),
             "driverless": sorted(f"{k.vendor}:{k.device}" for k in stand_ins if k.queue == "none")}
    if models:
        hooks["models"] = models
    expected.update(firmware)
    table |= {"selector": {"classes": list(profile.select_classes), "ids": list(profile.select_ids)},
              "device_plugin_resources": device_plugin_resources(profile),
              "firmware": expected,
              "hooks": hooks}
    return table


def device_plugin_resources(profile: HostProfile) -> dict[str, str]:
    """"vvvv:dddd" -> the extended resource the device-plugin front end serves its devices as:
    `hilconform.io/` + the model the slots stand in for (e.g. hilconform.io/nvidia-a100-sxm4-40gb),
    one per device kind the runtime manages."""
    resources: dict[str, str] = {}
    for slot in profile.slots:
        kind = profile.kind(slot.device if slot.populated else slot.accepts)
        dev_id = f"{kind.vendor}:{kind.device}"
        if dev_id not in profile.select_ids:
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", slot.stands_in_for.model.lower()).strip("-")[:63].strip("-")
        resources.setdefault(dev_id, f"hilconform.io/{slug or kind.vendor + '-' + kind.device}")
    return resources
