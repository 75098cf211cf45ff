"""REAL-01's emulated twin: which device models a host has, their link as the guest's sysfs
reads it, and the minimum of the real card behind their IDs.

A device model presents the real card's Link Capabilities and a Link Status the
tests set (the link-degraded knob), so its negotiated link can be judged the way
a real card's is; QEMU's stock stand-ins always train 2.5 GT/s x1 and cannot be.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest
from real_support import GENERATION_OF_GTS

from hilconform.fixtures.errors import InfrastructureError
from hilconform.fixtures.real_profile import LinkMinimum, profiles_matching

# A unit whose link the test bed can degrade presents a card's Link Capabilities and Status.
LINK_CAPABILITY = "link-degrade"
LINK_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


@dataclass(frozen=True)
class ManagedModel:
    slot: str
    bdf: str
    ids: str  # "vvvv:dddd", the real card's


def require_model_host(host_factory) -> None:
    """Skip, with the reason and before any VM starts, a real host (REAL-01's own test covers it)
    and an emulated host whose profile puts no device model in a slot."""
    host_spec = host_factory.spec
    if host_spec.is_real:
        pytest.skip(f"--host {host_spec} is a real host: its links are checked by test_real01_link.py; "
                    "this is the twin for emulated device-model hosts")
    profile = host_factory.profile
    if not any(s.populated and LINK_CAPABILITY in host_factory.slot_capabilities(s.name)
               for s in profile.slots):
        pytest.skip(f"host {host_spec} has no unit whose link can be set ({LINK_CAPABILITY!r}): its stock "
                    "stand-ins (QEMU's nvme/edu) always train 2.5 GT/s x1 whatever the slot, so there is no "
                    "card link to check (the twin runs on model hosts, e.g. emulated:a100)")


def managed_models(host) -> list[ManagedModel]:
    """The device models in the host's slots that its runtime manages (at least one)."""
    profile = host.profile
    selected = {i.lower() for i in profile.select_ids}
    truth = {f.bdf: f for f in host.ground_truth()}
    found = []
    for slot in profile.slots:
        if not slot.populated or LINK_CAPABILITY not in host.target_capabilities(slot.name):
            continue
        bdf = host.target_bdf(slot.name)
        if truth[bdf].ids in selected:
            found.append(ManagedModel(slot.name, bdf, truth[bdf].ids))
    if not found:
        pytest.skip(f"host {host.description}: its runtime manages none of the device models "
                    f"(selects {', '.join(profile.select_ids)})")
    return found


def guest_link_record(host, bdf: str) -> dict:
    """The guest kernel's sysfs link attributes of one function (None where absent)."""
    base = f"/sys/bus/pci/devices/{bdf}"
    script = "; ".join(f"printf '%s=%s\\n' {a} \"$(cat {shlex.quote(base + '/' + a)} 2>/dev/null)\""
                       for a in LINK_ATTRS)
    result = host.shell(script, timeout_s=30)
    if result.exit_code != 0:
        raise InfrastructureError(f"reading the link of {bdf} in the guest failed: {result.stderr.strip()}")
    record = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {a: (record.get(a) or None) for a in LINK_ATTRS}


def real_minimum(ids: str) -> LinkMinimum:
    """The link minimum of the one real-host profile (fixtures/real_profiles/) naming these IDs."""
    profiles = profiles_matching({ids})
    if len(profiles) != 1:
        names = ", ".join(p.name for p in profiles) or "none"
        raise InfrastructureError(f"device model {ids}: exactly one real-host profile must name its IDs "
                                  f"to give its link minimum (found: {names})")
    return profiles[0].link_min


def below(minimum: LinkMinimum) -> tuple[str, int]:
    """A link one generation and half the lanes below the minimum, as the degrade knob names it."""
    gts = {gen: speed for speed, gen in GENERATION_OF_GTS.items()}[minimum.generation - 1]
    return f"{gts:g}".replace(".", "_"), max(1, minimum.width // 2)
