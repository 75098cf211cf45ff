"""Mutant dp_deaf_to_orderly_removal, breaks DP-07: a device under orderly removal stays Healthy
until it has left the bus.

Plausible bug: the plugin watches only presence and error state, not its runtime's DEALLOCATE:
while the runtime isolates and drains a device for removal, the kubelet may still place a pod on
it, and learns of the removal only once the device is gone.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    def health_blind_to_removal(dev):
        busy = dev.gone or dev.resetting or dev.aer.recovering_since_ns is not None
        usable = dev.states.health in front_end.USABLE_STATES and not busy
        return front_end.HEALTHY if usable else front_end.UNHEALTHY

    front_end.device_health = health_blind_to_removal


if __name__ == "__main__":
    launch("dp_deaf_to_orderly_removal", apply)
