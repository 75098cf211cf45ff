"""Mutant dp_health_is_presence, breaks DP-03: a device is Healthy as long as it is on the bus.

Plausible bug: the plugin's health check asks only whether the device is still enumerated (its
PCI address exists), never whether it works: a GPU whose configuration was lost, or that reads
all ones, stays Healthy and the kubelet keeps scheduling pods onto it. A device that leaves the
bus is still dropped, so the removal test alone cannot tell this plugin from a good one.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    front_end.device_health = lambda dev: front_end.HEALTHY


if __name__ == "__main__":
    launch("dp_health_is_presence", apply)
