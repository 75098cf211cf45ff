"""Mutant dp_new_id_on_return, breaks DP-04: a device that comes back gets a new ID.

Plausible bug: the plugin names devices by an index or a counter of arrivals instead of the
unit's identity; the same GPU re-seated in its slot is advertised as a new device (pods holding
the old ID are stranded, the kubelet's checkpoint no longer matches).
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch


def apply() -> None:
    original = front_end.DevicePluginFrontEnd.snapshot
    arrivals: dict[str, int] = {}
    present: set[str] = set()

    def id_per_arrival(self, endpoint):
        current = original(self, endpoint)
        listed = {d.ID for d in current}
        for device_id in listed - present:
            arrivals[device_id] = arrivals.get(device_id, -1) + 1
        present.clear()
        present.update(listed)
        return tuple(Device(ID=f"{d.ID}-{arrivals[d.ID]}", health=d.health, topology=d.topology)
                     for d in current)

    front_end.DevicePluginFrontEnd.snapshot = id_per_arrival
    original_bdf_of = front_end.DevicePluginFrontEnd.bdf_of
    front_end.DevicePluginFrontEnd.bdf_of = lambda self, i: original_bdf_of(self, i.rsplit("-", 1)[0])


if __name__ == "__main__":
    launch("dp_new_id_on_return", apply)
