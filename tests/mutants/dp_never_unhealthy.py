"""Mutant dp_never_unhealthy, breaks DP-03: every device the plugin ever saw stays Healthy.

Plausible bug: the plugin's health check never runs (or only logs), and it keeps devices that
left the bus in its list: the kubelet goes on scheduling pods onto a GPU that is gone.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch


def apply() -> None:
    original = front_end.DevicePluginFrontEnd.snapshot

    def everything_healthy_forever(self, endpoint):
        seen = getattr(endpoint, "ever_seen", {})
        for device in original(self, endpoint):
            seen[device.ID] = Device(ID=device.ID, health=front_end.HEALTHY, topology=device.topology)
        endpoint.ever_seen = seen
        return tuple(seen[i] for i in sorted(seen))

    front_end.DevicePluginFrontEnd.snapshot = everything_healthy_forever


if __name__ == "__main__":
    launch("dp_never_unhealthy", apply)
