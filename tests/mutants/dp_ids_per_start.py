"""Mutant dp_ids_per_start, breaks DP-02: device IDs are made afresh at every plugin start.

Plausible bug: the plugin names devices with a UUID it generates when it starts (or a counter of
its own), not with anything of the device: every restart renames every device, and the kubelet's
checkpoint of which container holds which ID no longer matches anything.
"""

from __future__ import annotations

import uuid

from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch


def apply() -> None:
    original = front_end.DevicePluginFrontEnd.snapshot
    start = uuid.uuid4()

    def renamed_per_start(self, endpoint):
        return tuple(Device(ID=str(uuid.uuid5(start, d.ID)), health=d.health, topology=d.topology)
                     for d in original(self, endpoint))

    front_end.DevicePluginFrontEnd.snapshot = renamed_per_start
    original_bdf_of = front_end.DevicePluginFrontEnd.bdf_of

    def bdf_of(self, device_id):
        with self.service._lock:
            fingerprints = [d.info.fingerprint for d in self.service.devices.values()]
        for fingerprint in fingerprints:
            if str(uuid.uuid5(start, fingerprint)) == device_id:
                return original_bdf_of(self, fingerprint)
        return None

    front_end.DevicePluginFrontEnd.bdf_of = bdf_of


if __name__ == "__main__":
    launch("dp_ids_per_start", apply)
