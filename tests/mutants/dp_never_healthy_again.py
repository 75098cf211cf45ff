"""Mutant dp_never_healthy_again, breaks DP-04: a device once lost stays Unhealthy for good.

Plausible bug (reported against real plugins): the plugin marks a device Unhealthy on an error
and has no path back; a GPU that was re-seated or recovered stays unallocatable until the plugin
restarts.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch


def apply() -> None:
    original = front_end.DevicePluginFrontEnd.snapshot

    def unhealthy_once_unhealthy_forever(self, endpoint):
        lost = getattr(endpoint, "lost_ids", set())
        current = original(self, endpoint)
        listed = {d.ID for d in current}
        known = getattr(endpoint, "known_ids", set())
        lost |= {i for i in known if i not in listed}
        lost |= {d.ID for d in current if d.health != front_end.HEALTHY}
        endpoint.lost_ids, endpoint.known_ids = lost, known | listed
        return tuple(Device(ID=d.ID, health=front_end.UNHEALTHY if d.ID in lost else d.health,
                            topology=d.topology) for d in current)

    front_end.DevicePluginFrontEnd.snapshot = unhealthy_once_unhealthy_forever


if __name__ == "__main__":
    launch("dp_never_healthy_again", apply)
