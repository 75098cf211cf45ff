"""Mutant dp_listed_once, breaks DP-05: the device plugin tells the kubelet its devices once.

Plausible bug (users of real plugins report it): the plugin enumerates devices when it starts
and sends that one ListAndWatch message; a device hot-added later is never advertised until the
plugin restarts, and a lost one is never withdrawn.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    original = front_end.Endpoint.publish

    def publish_the_first_set_only(self, devices) -> None:
        if not self.devices:
            original(self, devices)

    front_end.Endpoint.publish = publish_the_first_set_only


if __name__ == "__main__":
    launch("dp_listed_once", apply)
