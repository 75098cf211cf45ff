"""Mutant dp_flags_wrong_device, breaks DP-03: a lost device's loss is reported on another device.

Plausible bug: the plugin keeps its devices in a list and, when its health check finds one
lost, marks an entry by a stale or shifted index (an off-by-one after sorting, an index kept
from before a re-enumeration): the next device in its list goes Unhealthy while the lost one
stays listed Healthy. The kubelet stops scheduling onto a good GPU and keeps scheduling onto
the one that is gone. When the lost device comes back, the wrong mark is lifted again.

A count of Healthy IDs cannot tell it from a good plugin (exactly one ID leaves Healthy each
time); only tying each ID to its device through what the plugin says (its Allocate answer's
device nodes and PCI addresses, which stay true here) can.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch


def apply() -> None:
    original = front_end.DevicePluginFrontEnd.snapshot

    def flags_the_next_device(self, endpoint):
        current = original(self, endpoint)
        known = endpoint.__dict__.setdefault("known_healthy", {})  # ID -> its last Healthy entry
        for device in current:
            if device.health == front_end.HEALTHY:
                known[device.ID] = device
        healthy_now = {d.ID for d in current if d.health == front_end.HEALTHY}
        lost = sorted(i for i in known if i not in healthy_now)
        listed = {d.ID: d for d in current}
        listed.update({i: known[i] for i in lost})  # the lost one stays listed Healthy
        order = sorted(listed)
        for device_id in lost:
            at = order.index(device_id)
            others = [i for i in order[at + 1:] + order[:at] if i not in lost]
            if others:  # the next one in the list takes the loss
                wrong = listed[others[0]]
                listed[wrong.ID] = Device(ID=wrong.ID, health=front_end.UNHEALTHY, topology=wrong.topology)
        return tuple(listed[i] for i in order)

    front_end.DevicePluginFrontEnd.snapshot = flags_the_next_device


if __name__ == "__main__":
    launch("dp_flags_wrong_device", apply)
