"""A tiny device plugin for tests, on real grpcio over a real unix socket.

It serves DevicePlugin in the plugin directory, registers with whatever kubelet.sock is
there, streams the device lists a test pushes, answers Allocate for the IDs it knows, and
notes what it was asked and when (GetDevicePluginOptions before Register returned?).
"""

from __future__ import annotations

import os
import queue
import threading

import grpc

from hilconform.runtime.deviceplugin import grpc_api
from hilconform.runtime.deviceplugin.constants import HEALTHY, KUBELET_SOCKET_NAME, VERSION
from hilconform.runtime.deviceplugin.messages import (
    AllocateResponse,
    ContainerAllocateResponse,
    ContainerPreferredAllocationResponse,
    Device,
    DevicePluginOptions,
    DeviceSpec,
    ListAndWatchResponse,
    PreferredAllocationResponse,
    PreStartContainerResponse,
    RegisterRequest,
)

END = object()  # push(END) ends the ListAndWatch stream


class FakePlugin:
    def __init__(
        self,
        plugin_dir: str,
        socket_name: str = "fake.sock",
        resource: str = "example.com/gpu",
        options: DevicePluginOptions | None = None,
        max_message_bytes: int = 16 << 20,
    ):
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self.socket_path = os.path.join(plugin_dir, socket_name)
        self.resource = resource
        self.options = options or DevicePluginOptions(get_preferred_allocation_available=True)
        self.max_message_bytes = max_message_bytes
        self.known_ids: set[str] = set()
        self.updates: queue.Queue = queue.Queue()
        self.calls: list[tuple[str, object]] = []
        self.register_returned = threading.Event()
        self.options_before_register_returned: bool | None = None
        self.watch_opened = threading.Semaphore(0)  # released once per ListAndWatch call
        self.watch_calls = 0
        self._server: grpc.Server | None = None

    # -- life ------------------------------------------------------------------------------------------
    def start(self) -> FakePlugin:
        self._server = grpc_api.serve_unix(
            [grpc_api.device_plugin_handler(self)], self.socket_path, self.max_message_bytes
        )
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None

    def register(
        self,
        version: str = VERSION,
        resource: str | None = None,
        endpoint: str | None = None,
        timeout: float = 10.0,
    ):
        """Register with the kubelet.sock of the plugin directory; grpc.RpcError when refused."""
        self.register_returned.clear()
        request = RegisterRequest(
            version=version,
            endpoint=self.socket_name if endpoint is None else endpoint,
            resource_name=self.resource if resource is None else resource,
            options=self.options,
        )
        channel = grpc.insecure_channel(f"unix:{os.path.join(self.plugin_dir, KUBELET_SOCKET_NAME)}")
        try:
            return grpc_api.RegistrationClient(channel).register(request, timeout=timeout)
        finally:
            self.register_returned.set()
            channel.close()

    def push(self, *devices: Device) -> None:
        self.known_ids.update(d.ID for d in devices)
        self.updates.put(ListAndWatchResponse(devices))

    def push_ids(self, healthy: list[str], unhealthy: list[str] = ()) -> None:
        self.push(*[Device(i, HEALTHY) for i in healthy], *[Device(i, "Unhealthy") for i in unhealthy])

    # -- DevicePlugin service ------------------------------------------------------------------------------
    def GetDevicePluginOptions(self, request, context):
        self.calls.append(("GetDevicePluginOptions", request))
        self.options_before_register_returned = not self.register_returned.is_set()
        return self.options

    def ListAndWatch(self, request, context):
        self.watch_calls += 1
        self.watch_opened.release()
        while context.is_active():
            try:
                item = self.updates.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is END:
                return
            yield item

    def Allocate(self, request, context):
        self.calls.append(("Allocate", request))
        unknown = [i for c in request.container_requests for i in c.devices_ids if i not in self.known_ids]
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device(s) {unknown}")
        return AllocateResponse(
            [
                ContainerAllocateResponse(
                    envs={"FAKE_DEVICES": ",".join(c.devices_ids)},
                    devices=[DeviceSpec(f"/dev/fake{i}", f"/dev/fake{i}", "rw") for i in c.devices_ids],
                )
                for c in request.container_requests
            ]
        )

    def GetPreferredAllocation(self, request, context):
        self.calls.append(("GetPreferredAllocation", request))
        return PreferredAllocationResponse(
            [
                ContainerPreferredAllocationResponse(c.available_deviceIDs[: c.allocation_size])
                for c in request.container_requests
            ]
        )

    def PreStartContainer(self, request, context):
        self.calls.append(("PreStartContainer", request))
        return PreStartContainerResponse()
