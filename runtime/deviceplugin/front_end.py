"""The reference runtime's Kubernetes device-plugin front end: its lifecycle, told to the kubelet.

One plugin endpoint per configured resource (`[device_plugin_resources]`: "vvvv:dddd" = name),
each a gRPC server on `<device_plugin_dir>/hilconform-<n>.sock` registered with the kubelet's
`kubelet.sock` (retried until it answers). The kubelet removes plugin sockets when it restarts;
a vanished socket makes the endpoint serve again and register again.

What the kubelet is told (docs/device-plugins.md):
* a device's ID is its fingerprint (the unit's identity: the same unit keeps it across a
  re-add, another unit in the slot gets another);
* `Healthy` while its health is HEALTHY, ALLOCATED, RELEASED or DEGRADED (still usable) and no
  isolation, removal, reset or error recovery is under way; `Unhealthy` otherwise (DISCOVERED
  before its self-check, FAULTED); REMOVED drops it;
* every change of that set is one ListAndWatch message (the whole set);
* `Allocate` answers the device's nodes (the char/block nodes below it in sysfs, the VFIO group
  for a vfio-pci device) and environment naming the PCI addresses; an unknown or unhealthy ID
  is refused.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time

import grpc

from .constants import HEALTHY, KUBELET_SOCKET_NAME, UNHEALTHY, VERSION
from .grpc_api import RegistrationClient, device_plugin_handler, serve_unix, unix_channel, wait_ready
from .messages import (
    AllocateResponse,
    ContainerAllocateResponse,
    ContainerPreferredAllocationResponse,
    Device,
    DevicePluginOptions,
    DeviceSpec,
    ListAndWatchResponse,
    NUMANode,
    PreferredAllocationResponse,
    PreStartContainerResponse,
    RegisterRequest,
    TopologyInfo,
)

_log = logging.getLogger("hilconform.runtime.deviceplugin")

USABLE_STATES = ("HEALTHY", "ALLOCATED", "RELEASED", "DEGRADED")
MAX_MESSAGE_BYTES = 4 << 20
REGISTER_TIMEOUT_S = 5.0
WATCH_S = 0.2  # how often an endpoint looks for its socket (gone: the kubelet restarted)
RETRY_S = 1.0  # between registration attempts while the kubelet does not answer
REPORT_OUT_S = 2.0  # an orderly removal waits at most this long for the kubelet to be sent the loss
_CHILD_FUNCTION = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def device_health(dev) -> str:
    """`Healthy` / `Unhealthy` for one runtime device record (lock held by the caller)."""
    busy = dev.isolated or dev.leaving or dev.gone or dev.resetting or dev.aer.recovering_since_ns is not None
    return HEALTHY if dev.states.health in USABLE_STATES and not busy else UNHEALTHY


class KubeletAbsent(FileNotFoundError):
    """No kubelet socket in the plugin directory (yet): registering waits for one."""


class Endpoint:
    """One resource: its plugin server, its registration, and the streams it feeds."""

    def __init__(self, front_end: DevicePluginFrontEnd, resource: str, ids: set[str], socket_name: str):
        self.front_end, self.resource, self.ids = front_end, resource, ids
        self.socket_name = socket_name
        self.path = os.path.join(front_end.plugin_dir, socket_name)
        self.server: grpc.Server | None = None
        self.registered = False
        self.devices: tuple[Device, ...] = ()
        self._streams: list[queue.Queue] = []
        self._handed: dict[int, tuple[Device, ...]] = {}  # id(stream) -> the set gRPC last took from it
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)

    # -- serving -------------------------------------------------------------------------------
    def serve(self) -> None:
        self.stop_serving()
        if os.path.lexists(self.path):
            os.unlink(self.path)
        self.server = serve_unix([device_plugin_handler(self)], self.path, MAX_MESSAGE_BYTES)
        self.registered = False
        _log.info("device plugin %s serving on %s", self.resource, self.path)

    def stop_serving(self) -> None:
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.put(None)
        if self.server is not None:
            self.server.stop(0)
            self.server = None

    def register(self) -> None:
        """Register with the kubelet. Its socket is looked for first (no kubelet: nothing to wait
        for, the loop looks again); once it answers, the kubelet has removed the old sockets (it
        does that before it listens), so a socket of ours gone by then is served again before the
        kubelet is told to dial it (else its first dial fails and waits out gRPC's back-off)."""
        kubelet = os.path.join(self.front_end.plugin_dir, KUBELET_SOCKET_NAME)
        if not os.path.exists(kubelet):
            raise KubeletAbsent(kubelet)
        channel = unix_channel(kubelet, MAX_MESSAGE_BYTES)
        try:
            wait_ready(channel, REGISTER_TIMEOUT_S, f"the kubelet at {kubelet}")
            if not os.path.exists(self.path):
                self.serve()
            RegistrationClient(channel).register(
                RegisterRequest(version=VERSION, endpoint=self.socket_name, resource_name=self.resource,
                                options=self.options()),
                timeout=REGISTER_TIMEOUT_S,
            )
        finally:
            channel.close()
        self.registered = True
        _log.info("device plugin %s registered (%s)", self.resource, self.socket_name)

    def publish(self, devices: tuple[Device, ...]) -> None:
        """A new device set: every open ListAndWatch stream sends it (when it changed)."""
        with self._lock:
            if devices == self.devices:
                return
            self.devices = devices
            for stream in self._streams:
                stream.put(devices)

    # -- the DevicePlugin service ----------------------------------------------------------------
    @staticmethod
    def options() -> DevicePluginOptions:
        return DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def GetDevicePluginOptions(self, request, context) -> DevicePluginOptions:
        return self.options()

    def ListAndWatch(self, request, context):
        stream: queue.Queue = queue.Queue()
        with self._lock:
            self._streams.append(stream)
            first = self.devices
        try:
            yield ListAndWatchResponse(devices=first)
            self._took(stream, first)
            while context.is_active():
                try:
                    devices = stream.get(timeout=1.0)
                except queue.Empty:
                    continue
                if devices is None:
                    return
                yield ListAndWatchResponse(devices=devices)
                self._took(stream, devices)
        finally:
            with self._lock:
                if stream in self._streams:
                    self._streams.remove(stream)
                self._handed.pop(id(stream), None)
                self._taken.notify_all()

    def _took(self, stream: queue.Queue, devices: tuple[Device, ...]) -> None:
        """gRPC asked for the next message, so it has sent this one towards the kubelet."""
        with self._lock:
            self._handed[id(stream)] = devices
            self._taken.notify_all()

    def wait_reported_out(self, device_id: str, timeout_s: float) -> bool:
        """Until every open ListAndWatch stream has sent a set without `device_id` Healthy (False:
        not by `timeout_s`). No stream open: nobody to tell, True."""
        def reported() -> bool:
            return all(not any(d.ID == device_id and d.health == HEALTHY for d in self._handed.get(id(s), ()))
                       and id(s) in self._handed for s in self._streams)
        with self._lock:
            return self._taken.wait_for(reported, timeout_s)

    def GetPreferredAllocation(self, request, context) -> PreferredAllocationResponse:
        healthy = {d.ID for d in self.devices if d.health == HEALTHY}
        answers = []
        for ask in request.container_requests:
            chosen = [i for i in ask.must_include_deviceIDs if i in healthy]
            chosen += sorted(i for i in ask.available_deviceIDs if i in healthy and i not in chosen)
            size = ask.allocation_size
            answers.append(ContainerPreferredAllocationResponse(deviceIDs=tuple(chosen[:size])))
        return PreferredAllocationResponse(container_responses=tuple(answers))

    def Allocate(self, request, context) -> AllocateResponse:
        listed = {d.ID: d for d in self.devices}
        answers = []
        for ask in request.container_requests:
            unknown = [i for i in ask.devices_ids if i not in listed]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{self.resource}: unknown device IDs {unknown}")
            unhealthy = [i for i in ask.devices_ids if listed[i].health != HEALTHY]
            if unhealthy:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{self.resource}: devices not healthy: {unhealthy}")
            bdfs = [self.front_end.bdf_of(i) for i in ask.devices_ids]
            nodes = sorted({n for bdf in bdfs if bdf for n in self.front_end.device_nodes(bdf)})
            answers.append(ContainerAllocateResponse(
                envs={"HILCONFORM_DEVICE_IDS": ",".join(ask.devices_ids),
                      "HILCONFORM_PCI_ADDRESSES": ",".join(b for b in bdfs if b)},
                devices=tuple(DeviceSpec(container_path=n, host_path=n, permissions="rw") for n in nodes),
            ))
        return AllocateResponse(container_responses=tuple(answers))

    def PreStartContainer(self, request, context) -> PreStartContainerResponse:
        return PreStartContainerResponse()


class DevicePluginFrontEnd:
    """Runs beside the service: `notify()` (from every event the service emits) wakes it."""

    def __init__(self, service, cfg):
        self.service = service
        self.plugin_dir = cfg.device_plugin_dir
        by_resource: dict[str, set[str]] = {}
        for dev_id, resource in sorted(cfg.device_plugin_resources.items()):
            by_resource.setdefault(resource, set()).add(dev_id)
        self.endpoints = [Endpoint(self, resource, ids, f"hilconform-{n}.sock")
                          for n, (resource, ids) in enumerate(sorted(by_resource.items()))]
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        for target, name in ((self._publish_loop, "dp-publish"), (self._register_loop, "dp-register")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def notify(self, _event: str = "") -> None:
        self._wake.set()

    def report_out_of_service(self, bdf: str, timeout_s: float = REPORT_OUT_S) -> bool:
        """Publish now and wait until the kubelet's streams have been sent `bdf`'s device out of
        service (Unhealthy or gone): an orderly removal calls it before the device leaves the bus,
        so the kubelet hears of the removal first (DP-07). Bounded: a stuck stream never holds a
        removal longer than `timeout_s`."""
        with self.service._lock:
            dev = self.service.devices.get(bdf)
            if dev is None:
                return True
            device_id = dev.info.fingerprint
            kind = f"{dev.info.vendor_id:04x}:{dev.info.device_id:04x}"
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        return all(endpoint.wait_reported_out(device_id, max(0.0, deadline - time.monotonic()))
                   for endpoint in self.endpoints if kind in endpoint.ids)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for endpoint in self.endpoints:
            endpoint.stop_serving()
            if os.path.lexists(endpoint.path):
                os.unlink(endpoint.path)

    # -- what the devices are ------------------------------------------------------------------
    def snapshot(self, endpoint: Endpoint) -> tuple[Device, ...]:
        with self.service._lock:
            devices = [d for d in self.service.devices.values()
                       if f"{d.info.vendor_id:04x}:{d.info.device_id:04x}" in endpoint.ids
                       and d.states.health != "REMOVED" and not d.gone]
            listed = [Device(ID=d.info.fingerprint, health=device_health(d), topology=_topology(d.info))
                      for d in devices]
        return tuple(sorted(listed, key=lambda d: d.ID))

    def bdf_of(self, device_id: str) -> str | None:
        with self.service._lock:
            for dev in self.service.devices.values():
                if dev.info.fingerprint == device_id and not dev.gone:
                    return dev.bdf
        return None

    def device_nodes(self, bdf: str) -> list[str]:
        """The /dev nodes of a PCI device: every DEVNAME of the sysfs tree below it (not below its
        child functions), and /dev/vfio/vfio + its group when vfio-pci drives it; only those that
        exist on the node."""
        sysfs = self.service.sysfs
        root = sysfs.device_path(bdf)
        found = set()
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = [s for s in subfolders
                             if not _CHILD_FUNCTION.match(s) and s not in ("subsystem", "driver")]
            if "uevent" in files and folder != root:
                for line in (sysfs.read_text(os.path.join(folder, "uevent")) or "").splitlines():
                    if line.startswith("DEVNAME="):
                        found.add("/dev/" + line.split("=", 1)[1])
        if sysfs.driver(bdf) == "vfio-pci":
            group = os.path.realpath(os.path.join(root, "iommu_group"))
            found |= {"/dev/vfio/vfio", f"/dev/vfio/{os.path.basename(group)}"}
        return sorted(n for n in found if os.path.exists(n))

    # -- loops -----------------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(WATCH_S)
            self._wake.clear()
            for endpoint in self.endpoints:
                endpoint.publish(self.snapshot(endpoint))

    def _register_loop(self) -> None:
        """Serve and register each endpoint; again whenever its socket vanished (kubelet restart)."""
        while not self._stop.is_set():
            for endpoint in self.endpoints:
                try:
                    if endpoint.server is None or not os.path.exists(endpoint.path):
                        endpoint.serve()
                    if not endpoint.registered:
                        endpoint.register()
                except KubeletAbsent:
                    pass  # looked for again in WATCH_S
                except (OSError, TimeoutError, grpc.RpcError) as exc:
                    _log.info("device plugin %s: not registered yet: %s", endpoint.resource, exc)
                    self._stop.wait(RETRY_S)
            self._stop.wait(WATCH_S)


def _topology(info) -> TopologyInfo | None:
    """The NUMA node sysfs names; none where sysfs says -1 (or nothing)."""
    if info.numa_node is None or info.numa_node < 0:
        return None
    return TopologyInfo(nodes=(NUMANode(ID=info.numa_node),))

