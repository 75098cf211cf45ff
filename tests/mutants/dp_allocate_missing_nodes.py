"""Mutant dp_allocate_missing_nodes, breaks DP-09: Allocate names device nodes that do not exist.

Plausible bug: the plugin builds node paths from a naming scheme (/dev/nvidia<index>) instead of
reading them from the device; on a node whose numbering differs, containers start without their
device or fail to start.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    def nodes_by_naming_scheme(self, bdf: str) -> list[str]:
        with self.service._lock:
            index = sorted(self.service.devices).index(bdf) if bdf in self.service.devices else 0
        return [f"/dev/nvidia{index}", "/dev/nvidiactl"]

    front_end.DevicePluginFrontEnd.device_nodes = nodes_by_naming_scheme


if __name__ == "__main__":
    launch("dp_allocate_missing_nodes", apply)
