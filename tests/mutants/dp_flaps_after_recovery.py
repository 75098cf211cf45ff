"""Mutant dp_flaps_after_recovery, breaks DP-06: a device that comes back Healthy flickers
Unhealthy once more before it settles.

Plausible bug: after a device recovers, the plugin's own health probe re-checks it and reports
it Unhealthy while the probe runs, then Healthy again: every recovered error or completed reset
is two round trips for the kubelet (pods evicted and rescheduled twice).
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch


def apply() -> None:
    original = front_end.Endpoint.publish

    def publish_with_a_probe_flicker(self, devices):
        before = {d.ID: d.health for d in self.devices}
        back = {d.ID for d in devices
                if d.health == front_end.HEALTHY and before.get(d.ID) == front_end.UNHEALTHY}
        original(self, devices)
        if back:
            probing = tuple(Device(ID=d.ID, health=front_end.UNHEALTHY if d.ID in back else d.health,
                                   topology=d.topology) for d in devices)
            original(self, probing)
            original(self, devices)

    front_end.Endpoint.publish = publish_with_a_probe_flicker


if __name__ == "__main__":
    launch("dp_flaps_after_recovery", apply)
