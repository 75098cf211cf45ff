"""Mutant recover_leaves_config_lost, breaks LIFE-01: `recover` of a FAULTED device never writes
back the BARs a link reset cleared, so a device FAULTED by a fatal AER error stays FAULTED.

Plausible bug: the reference runtime before a02bb39. `recover` resets the device through sysfs
(the kernel saves the cleared config just before and restores it) and re-runs the self-check,
trusting a driver's `slot_reset` to have restored the configuration; where none did (vfio-pci
on the a100 models) BAR0 stays unreadable and the firmware step fails ('firmware version
unreadable'): the table's way back FAULTED -> HEALTHY@recover does not exist after a fatal error.
On a host whose driver restores its config (nvme on the stock hosts) the mutant cannot be told
from the reference.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    def never_restored(sysfs, bdf):
        return "skipped", {"skipped": "mutant: the config is trusted to be restored by a driver"}

    procedures.restore_assigned_config = never_restored


if __name__ == "__main__":
    launch("recover_leaves_config_lost", apply)
