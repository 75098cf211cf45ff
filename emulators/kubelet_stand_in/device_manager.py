"""The kubelet's device manager as plugins see it: kubelet.sock, Register, endpoints, restart.

Why these rules (the kubelet's, pkg/kubelet/cm/devicemanager): on start the plugin
directory is created and its sockets removed; Register refuses a version other than
v1beta1 and a name that is not an extended resource name, dials the plugin's socket
(``endpoint`` inside the plugin directory) and asks GetDevicePluginOptions before it
answers; then ListAndWatch is read until it ends and is never re-opened; a new
registration of a resource replaces the old one. A restart ends every connection, stops
serving, removes every socket and serves a new kubelet.sock, as a kubelet process that
ends and starts again does. Unlike the kubelet, every wait has a deadline (dialling,
GetDevicePluginOptions, each control call) and everything is recorded (records.py).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import grpc

from hilconform.runtime.deviceplugin import grpc_api
from hilconform.runtime.deviceplugin.constants import (
    HEALTHY,
    KUBELET_SOCKET_NAME,
    PRE_START_CONTAINER_TIMEOUT_S,
    SUPPORTED_VERSIONS,
)
from hilconform.runtime.deviceplugin.messages import (
    Device,
    DevicePluginOptions,
    Empty,
    ListAndWatchResponse,
    Message,
    RegisterRequest,
)
from hilconform.runtime.deviceplugin.wire import WireError

from . import control, plugin_dir
from .control import ControlError
from .endpoint import PluginEndpoint, rpc_error_text
from .records import RecordStore
from .resource_names import extended_resource_name_problem

_log = logging.getLogger("hilconform.kubelet_stand_in")

DEFAULT_MAX_MESSAGE_BYTES = 4 << 20  # gRPC's default receive limit, which the kubelet keeps
DEFAULT_DIAL_TIMEOUT_S = 10.0  # the kubelet's own deadline for dialling a plugin
SERVER_STOP_S = 5.0

# control method -> (gRPC method, record prefix, the option that offers it or None)
PLUGIN_CALLS = {
    "allocate": (grpc_api.ALLOCATE, "allocate", None),
    "preferred_allocation": (
        grpc_api.GET_PREFERRED_ALLOCATION,
        "preferred_allocation",
        "get_preferred_allocation_available",
    ),
    "prestart": (grpc_api.PRE_START_CONTAINER, "prestart", "pre_start_required"),
}


@dataclass
class _Resource:
    """What the stand-in knows of one registered resource (guarded by the manager's lock)."""

    name: str
    endpoint: PluginEndpoint | None = None  # None once its stream ended, or after a restart
    endpoint_name: str = ""
    options: DevicePluginOptions | None = None  # GetDevicePluginOptions' answer
    register_options: DevicePluginOptions | None = None  # what RegisterRequest carried
    registered: bool = False  # accepted since the stand-in last (re)started
    registrations: int = 0
    stream_end_reason: str | None = None
    updates: int = 0
    last_update_ns: int | None = None
    devices: tuple[Device, ...] = ()

    def state(self) -> dict:
        ids = [d.ID for d in self.devices]
        return {
            "registered": self.registered,
            "endpoint": self.endpoint_name,
            "options": self.options.to_json() if self.options else None,
            "register_options": self.register_options.to_json() if self.register_options else None,
            "registrations": self.registrations,
            "stream_open": self.endpoint is not None,
            "stream_end_reason": self.stream_end_reason,
            "updates": self.updates,
            "last_update_ns": self.last_update_ns,
            "capacity": len(self.devices),
            "allocatable": sum(d.health == HEALTHY for d in self.devices),
            "healthy": [d.ID for d in self.devices if d.health == HEALTHY],
            "unhealthy": [d.ID for d in self.devices if d.health != HEALTHY],
            "duplicate_ids": sorted({i for i in ids if ids.count(i) > 1}),
            "devices": [d.to_json() for d in self.devices],
        }


class KubeletStandIn:
    def __init__(
        self,
        directory: str,
        records: RecordStore | None = None,
        *,
        dial_timeout_s: float = DEFAULT_DIAL_TIMEOUT_S,
        call_timeout_s: float = control.DEFAULT_CALL_TIMEOUT_S,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.plugin_dir = os.path.abspath(directory)
        self.socket_path = os.path.join(self.plugin_dir, KUBELET_SOCKET_NAME)
        self.records = records if records is not None else RecordStore()
        self.dial_timeout_s = dial_timeout_s
        self.call_timeout_s = call_timeout_s
        self.max_message_bytes = max_message_bytes
        self._resources: dict[str, _Resource] = {}
        self._server: grpc.Server | None = None
        self._generation = 0  # kubelet starts so far
        self._accepting = False
        self._lock = threading.Lock()  # the state above
        self._life = threading.Lock()  # start, restart and stop, one at a time

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> dict:
        with self._life:
            return self._start("start")

    def restart(self) -> dict:
        """A simulated kubelet restart; the new kubelet.sock is served when this returns."""
        with self._life:
            self._shutdown("kubelet restart")
            return self._start("restart")

    def stop(self, reason: str = "stand-in stopped") -> None:
        with self._life:
            if self._server is None:
                return
            self._shutdown(reason)
            _unlink(self.socket_path)
            self.records.add("kubelet_stop", reason=reason)

    def _start(self, cause: str) -> dict:
        removed = plugin_dir.prepare(self.plugin_dir)
        _unlink(self.socket_path)  # whatever is there (the kubelet removes it before listening)
        with self._lock:
            self._generation += 1
            generation = self._generation
        self._server = grpc_api.serve_unix(
            [grpc_api.registration_handler(self, self._malformed)],
            self.socket_path,
            self.max_message_bytes,
            max_workers=8,
        )
        with self._lock:
            self._accepting = True
        self.records.add("kubelet_start", generation=generation, removed_sockets=removed, cause=cause)
        _log.info("serving %s (start %d; removed %s)", self.socket_path, generation, removed or "no sockets")
        return {"kubelet_socket": self.socket_path, "generation": generation, "removed_sockets": removed}

    def _shutdown(self, reason: str) -> None:
        """End every plugin connection (recorded as its stream's end), then stop serving."""
        with self._lock:
            self._accepting = False
            endpoints = [r.endpoint for r in self._resources.values() if r.endpoint is not None]
            for resource in self._resources.values():
                resource.registered = False
        for endpoint in endpoints:
            endpoint.close(reason)
        if self._server is not None:
            self._server.stop(grace=0).wait(SERVER_STOP_S)
            self._server = None

    # -- Registration service -----------------------------------------------------------------------
    def Register(self, request: RegisterRequest, context) -> Empty:
        resource = request.resource_name
        self.records.add("register_request", resource, request.to_json())
        with self._lock:
            generation = self._generation
        problem = self._refusal(request)
        if problem:
            self._refuse(context, resource, problem)
        socket_path = os.path.join(self.plugin_dir, request.endpoint)
        endpoint = PluginEndpoint(resource, socket_path, self.max_message_bytes)
        options, problem = self._connect(endpoint)
        if problem:
            endpoint.close(problem)
            self._refuse(context, resource, problem)
        self.records.add("options", resource, options.to_json())
        old = None
        with self._lock:
            current = self._accepting and self._generation == generation
            if current:
                entry = self._resources.setdefault(resource, _Resource(resource))
                old = entry.endpoint
                entry.endpoint = endpoint
                entry.endpoint_name = request.endpoint
                entry.options = options
                entry.register_options = request.options
                entry.registered = True
                entry.registrations += 1
                entry.stream_end_reason = None
        if not current:
            endpoint.close("the kubelet restarted while the plugin registered")
            self._refuse(
                context,
                resource,
                "the kubelet restarted while the plugin registered",
                grpc.StatusCode.UNAVAILABLE,
            )
        self.records.add("register_accepted", resource, endpoint=socket_path)
        if old is not None:
            old.close("replaced by a new registration of the same resource")
        endpoint.start_watch(self._on_update, self._on_end)
        return Empty()

    def _refusal(self, request: RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f"requested API version {request.version!r} is not supported by the kubelet; "
                f"supported: {list(SUPPORTED_VERSIONS)}"
            )
        problem = extended_resource_name_problem(request.resource_name)
        if problem:
            return f"resource name {request.resource_name!r} is invalid: it {problem}"
        return None

    def _connect(self, endpoint: PluginEndpoint) -> tuple[DevicePluginOptions | None, str | None]:
        try:
            return endpoint.connect(self.dial_timeout_s, self.call_timeout_s), None
        except TimeoutError as exc:
            return None, f"cannot dial the plugin: {exc}"
        except grpc.RpcError as exc:
            return None, f"GetDevicePluginOptions failed: {rpc_error_text(exc)}"
        except WireError as exc:
            return None, f"GetDevicePluginOptions answered malformed: {exc}"

    def _refuse(self, context, resource: str, reason: str, code=grpc.StatusCode.UNKNOWN):
        """Record and answer the refusal (the kubelet's plain errors reach plugins as UNKNOWN)."""
        self.records.add("register_refused", resource, reason=reason)
        _log.info("registration of %r refused: %s", resource, reason)
        context.abort(code, reason)

    def _malformed(self, method: grpc_api.Method, exc: WireError) -> None:
        self.records.add("malformed", method=method.path, reason=str(exc))

    # -- ListAndWatch -------------------------------------------------------------------------------
    def _on_update(
        self, endpoint: PluginEndpoint, message: ListAndWatchResponse, ts_ns: int, size: int
    ) -> None:
        allocatable = sum(d.health == HEALTHY for d in message.devices)
        with self._lock:
            entry = self._resources.get(endpoint.resource)
            if entry is not None and entry.endpoint is endpoint:
                entry.devices = message.devices
                entry.updates += 1
                entry.last_update_ns = ts_ns
        self.records.add(
            "list_and_watch",
            endpoint.resource,
            message.to_json(),
            ts_ns=ts_ns,
            capacity=len(message.devices),
            allocatable=allocatable,
            bytes=size,
        )

    def _on_end(self, endpoint: PluginEndpoint, reason: str) -> None:
        with self._lock:
            entry = self._resources.get(endpoint.resource)
            if entry is not None and entry.endpoint is endpoint:
                entry.endpoint = None
                entry.stream_end_reason = reason
        self.records.add("stream_end", endpoint.resource, reason=reason)
        _log.info("ListAndWatch of %s ended: %s", endpoint.resource, reason)

    # -- the host's view ----------------------------------------------------------------------------
    def state(self) -> dict:
        with self._lock:
            resources = {name: entry.state() for name, entry in sorted(self._resources.items())}
            serving, generation = self._accepting, self._generation
        return {
            "kubelet_socket": self.socket_path,
            "plugin_dir": self.plugin_dir,
            "serving": serving,
            "generation": generation,
            "resources": resources,
            "records": self.records.stats(),
            "dropped": self.records.dropped(),
        }

    def call_plugin(
        self, name: str, resource: str, request: Message, timeout_s: float | None = None, force: bool = False
    ) -> Message:
        """Call the plugin of ``resource`` as the kubelet would (``name`` is a PLUGIN_CALLS key);
        ControlError says why there is no answer. Request, answer or error are recorded."""
        method, prefix, option = PLUGIN_CALLS[name]
        if timeout_s is None:  # PreStartContainer keeps the kubelet's own deadline
            timeout_s = PRE_START_CONTAINER_TIMEOUT_S if name == "prestart" else self.call_timeout_s
        with self._lock:
            entry = self._resources.get(resource)
            if entry is None:
                known = sorted(self._resources)
                raise ControlError(
                    control.UNKNOWN_RESOURCE,
                    f"no plugin registered {resource!r} with this kubelet stand-in (known: {known})",
                )
            endpoint = entry.endpoint
            why_not = entry.stream_end_reason or "a kubelet restart ended its connection"
            offered = option is None or bool(entry.options and getattr(entry.options, option))
        if endpoint is None:
            raise ControlError(
                control.NOT_CONNECTED,
                f"{resource}: no connection to its plugin (ListAndWatch ended: {why_not})",
            )
        if not offered and not force:
            raise ControlError(
                control.NOT_OFFERED,
                f"{resource}: the plugin's options do not set {option}, so the kubelet would not call "
                f"{method.name} (force: true calls it anyway)",
            )
        self.records.add(f"{prefix}_request", resource, request.to_json())
        try:
            response = endpoint.call(method, request, timeout_s)
        except grpc.RpcError as exc:
            error = self._call_error(method, resource, timeout_s, exc)
        except WireError as exc:
            error = ControlError(control.MALFORMED_REPLY, f"{method.name} answered malformed: {exc}")
        except ValueError as exc:  # grpcio: the channel was closed meanwhile
            error = ControlError(
                control.NOT_CONNECTED, f"{resource}: connection closed during {method.name} ({exc})"
            )
        else:
            self.records.add(f"{prefix}_response", resource, response.to_json())
            return response
        self.records.add(
            f"{prefix}_error", resource, code=error.code, reason=error.message, **(error.data or {})
        )
        raise error

    @staticmethod
    def _call_error(
        method: grpc_api.Method, resource: str, timeout_s: float, exc: grpc.RpcError
    ) -> ControlError:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ControlError(
                control.TIMEOUT,
                f"no answer to {method.name} from the plugin of {resource} within {timeout_s:g} s",
            )
        return ControlError(
            control.PLUGIN_ERROR,
            f"{method.name} failed: {rpc_error_text(exc)}",
            {"grpc_code": code.name if code else "UNKNOWN", "details": exc.details() or ""},
        )


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise OSError(f"{path} is a directory; the kubelet socket cannot be served there") from None
