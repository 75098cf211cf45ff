#!/usr/bin/env python3
"""A naive third-party device plugin, for certifying a plugin hilconform did not write.

Usage: naive_static_plugin.py RESOURCE VVVV:DDDD [PLUGIN_DIR]

It behaves as many small plugins do: it lists the PCI devices of one vendor:device from sysfs
once, at start, all Healthy, registers with kubelet.sock, sends that one ListAndWatch message
and never another, never watches its socket (no re-registration after a kubelet restart), and
answers Allocate with the device nodes below each device. Written to pass DP-01, DP-02 and DP-09
and to fail DP-03, DP-05 (and DP-04's loss) and DP-08 (not yet run through the suite). It is
not part of hilconform's runtime; it uses the project's API package only to speak v1beta1.
"""

from __future__ import annotations

import glob
import os
import sys
import time

sys.path.insert(0, "/run/hilconform/py")  # the guest's hilconform packages (the v1beta1 API)

from hilconform.runtime.deviceplugin import grpc_api  # noqa: E402
from hilconform.runtime.deviceplugin.constants import (  # noqa: E402,E501
    DEVICE_PLUGIN_PATH,
    HEALTHY,
    KUBELET_SOCKET_NAME,
    VERSION,
)
from hilconform.runtime.deviceplugin.messages import (  # noqa: E402
    AllocateResponse,
    ContainerAllocateResponse,
    Device,
    DevicePluginOptions,
    DeviceSpec,
    ListAndWatchResponse,
    RegisterRequest,
)


def devices_of(ids: str) -> dict[str, str]:
    vendor, device = ids.split(":")
    found = {}
    for path in sorted(glob.glob("/sys/bus/pci/devices/*")):
        try:
            v = open(os.path.join(path, "vendor")).read().strip()[2:]
            d = open(os.path.join(path, "device")).read().strip()[2:]
        except OSError:
            continue
        if (v, d) == (vendor, device):
            found[f"dev-{os.path.basename(path)}"] = os.path.basename(path)
    return found


class NaivePlugin:
    def __init__(self, devices: dict[str, str]):
        self.devices = devices

    def GetDevicePluginOptions(self, request, context):
        return DevicePluginOptions()

    def ListAndWatch(self, request, context):
        yield ListAndWatchResponse(devices=tuple(Device(ID=i, health=HEALTHY) for i in self.devices))
        while context.is_active():
            time.sleep(1)

    def Allocate(self, request, context):
        answers = []
        for ask in request.container_requests:
            nodes = []
            for device_id in ask.devices_ids:
                bdf = self.devices.get(device_id, "")
                for uevent in glob.glob(f"/sys/bus/pci/devices/{bdf}/*/*/uevent") if bdf else []:
                    for line in open(uevent).read().splitlines():
                        if line.startswith("DEVNAME="):
                            nodes.append("/dev/" + line[8:])
            answers.append(ContainerAllocateResponse(
                devices=tuple(DeviceSpec(container_path=n, host_path=n, permissions="rw") for n in nodes)))
        return AllocateResponse(container_responses=tuple(answers))


def main(argv: list[str]) -> int:
    resource, ids = argv[0], argv[1]
    plugin_dir = argv[2] if len(argv) > 2 else DEVICE_PLUGIN_PATH
    plugin = NaivePlugin(devices_of(ids))
    socket_path = os.path.join(plugin_dir, "naive.sock")
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    server = grpc_api.serve_unix([grpc_api.device_plugin_handler(plugin)], socket_path, 4 << 20)
    channel = grpc_api.unix_channel(os.path.join(plugin_dir, KUBELET_SOCKET_NAME), 4 << 20)
    grpc_api.wait_ready(channel, 60, "the kubelet")
    grpc_api.RegistrationClient(channel).register(
        RegisterRequest(version=VERSION, endpoint="naive.sock", resource_name=resource), timeout=30)
    print(f"naive plugin: registered {resource} with {len(plugin.devices)} devices", flush=True)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
