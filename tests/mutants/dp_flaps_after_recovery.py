"""Mutant dp_flaps_after_recovery, breaks DP-06: every error or reset event the plugin hears about
a device flips it Unhealthy and back.

Plausible bug: an event-driven health check that marks a device Unhealthy for each AER or reset
event it sees and Healthy again at its next probe: a reset that completes, or a non-fatal error
that the kernel recovers, becomes several round trips for the kubelet (pods evicted and
rescheduled each time), where the clause allows one.
"""

from __future__ import annotations

from hilconform.runtime import service
from hilconform.runtime.deviceplugin import front_end
from hilconform.runtime.deviceplugin.messages import Device

from .launch import launch

FLAPPING_EVENTS = ("aer", "reset", "procedure")


def apply() -> None:
    original_emit = service.Service.emit

    def emit_and_flap(self, name, data, ts_ns=None):
        message = original_emit(self, name, data, ts_ns)
        plugin = getattr(self, "front_end", None)
        dev = self.devices.get(data.get("device")) if isinstance(data, dict) else None
        if plugin is not None and dev is not None and name in FLAPPING_EVENTS:
            flipped = dev.info.fingerprint
            for endpoint in plugin.endpoints:
                current = endpoint.devices
                if any(d.ID == flipped for d in current):
                    endpoint.publish(tuple(
                        Device(ID=d.ID, health=front_end.UNHEALTHY if d.ID == flipped else d.health,
                               topology=d.topology) for d in current))
                    endpoint.publish(current)
        return message

    service.Service.emit = emit_and_flap


if __name__ == "__main__":
    launch("dp_flaps_after_recovery", apply)
