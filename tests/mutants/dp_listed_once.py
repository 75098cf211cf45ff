"""Mutant dp_listed_once, breaks DP-05: the device plugin tells the kubelet its devices once.

Plausible bug (users of real plugins report it): the plugin enumerates devices when it starts
(once they are ready) and sends that one ListAndWatch message; a device hot-added later is never
advertised until the plugin restarts, and a lost one is never withdrawn.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    original = front_end.Endpoint.publish

    def publish_until_first_ready(self, devices) -> None:
        """Sends sets until the first one whose devices are all Healthy (the node's devices
        ready: the set it enumerates at start), then nothing more. So the plugin passes a
        start, and only a later change (DP-05's hot-add) finds it out."""
        settled = self.devices and all(d.health == front_end.HEALTHY for d in self.devices)
        if not settled:
            original(self, devices)

    front_end.Endpoint.publish = publish_until_first_ready


if __name__ == "__main__":
    launch("dp_listed_once", apply)
