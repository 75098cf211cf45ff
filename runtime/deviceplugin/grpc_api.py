"""The two services of the API on grpcio, without generated code.

Why generic handlers and raw bytes: grpcio's own (de)serializer hooks turn a decoding
error into a bare "Exception deserializing ..." status and a log line; decoding here
instead keeps ``WireError``'s text (the field that was malformed) for the caller, and a
server answers a malformed request with INVALID_ARGUMENT naming it. Only APIs present in
grpcio 1.51 (Debian 12) and still in the newest are used: ``method_handlers_generic_handler``,
``*_rpc_method_handler``, ``channel.unary_unary`` / ``unary_stream``, ``channel_ready_future``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc

from .messages import (
    AllocateRequest,
    AllocateResponse,
    DevicePluginOptions,
    Empty,
    ListAndWatchResponse,
    Message,
    PreferredAllocationRequest,
    PreferredAllocationResponse,
    PreStartContainerRequest,
    PreStartContainerResponse,
    RegisterRequest,
)
from .wire import WireError

REGISTRATION_SERVICE = "v1beta1.Registration"
DEVICE_PLUGIN_SERVICE = "v1beta1.DevicePlugin"


@dataclass(frozen=True)
class Method:
    service: str
    name: str  # also the servicer's method name, as generated code has it
    request: type[Message]
    response: type[Message]
    server_streaming: bool = False

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


REGISTER = Method(REGISTRATION_SERVICE, "Register", RegisterRequest, Empty)
GET_DEVICE_PLUGIN_OPTIONS = Method(
    DEVICE_PLUGIN_SERVICE, "GetDevicePluginOptions", Empty, DevicePluginOptions
)
LIST_AND_WATCH = Method(DEVICE_PLUGIN_SERVICE, "ListAndWatch", Empty, ListAndWatchResponse, True)
GET_PREFERRED_ALLOCATION = Method(
    DEVICE_PLUGIN_SERVICE, "GetPreferredAllocation", PreferredAllocationRequest, PreferredAllocationResponse
)
ALLOCATE = Method(DEVICE_PLUGIN_SERVICE, "Allocate", AllocateRequest, AllocateResponse)
PRE_START_CONTAINER = Method(
    DEVICE_PLUGIN_SERVICE, "PreStartContainer", PreStartContainerRequest, PreStartContainerResponse
)
REGISTRATION_METHODS = (REGISTER,)
DEVICE_PLUGIN_METHODS = (
    GET_DEVICE_PLUGIN_OPTIONS,
    LIST_AND_WATCH,
    GET_PREFERRED_ALLOCATION,
    ALLOCATE,
    PRE_START_CONTAINER,
)

OnMalformed = Callable[[Method, WireError], None]


# -- serving ----------------------------------------------------------------------------------------


def registration_handler(servicer, on_malformed: OnMalformed | None = None) -> grpc.GenericRpcHandler:
    """Serve ``servicer.Register(request, context) -> Empty`` (the kubelet's side)."""
    return _generic_handler(REGISTRATION_SERVICE, REGISTRATION_METHODS, servicer, on_malformed)


def device_plugin_handler(servicer, on_malformed: OnMalformed | None = None) -> grpc.GenericRpcHandler:
    """Serve the DevicePlugin methods ``servicer`` has (a plugin's side); the others are
    UNIMPLEMENTED, as gRPC answers for any unknown method. ``ListAndWatch`` yields messages."""
    return _generic_handler(DEVICE_PLUGIN_SERVICE, DEVICE_PLUGIN_METHODS, servicer, on_malformed)


def _generic_handler(service: str, methods, servicer, on_malformed) -> grpc.GenericRpcHandler:
    handlers = {}
    for method in methods:
        behaviour = getattr(servicer, method.name, None)
        if behaviour is not None:
            handlers[method.name] = _method_handler(method, behaviour, on_malformed)
    return grpc.method_handlers_generic_handler(service, handlers)


def _method_handler(method: Method, behaviour, on_malformed):
    def decoded(raw: bytes, context):
        try:
            return method.request.decode(raw)
        except WireError as exc:
            if on_malformed is not None:
                on_malformed(method, exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {method.request.proto_name}: {exc}")

    def serialize(message) -> bytes:
        if not isinstance(message, method.response):
            raise TypeError(f"{method.path} answers {method.response.__name__}, not {type(message).__name__}")
        return message.encode()

    if method.server_streaming:

        def stream(raw: bytes, context):
            yield from behaviour(decoded(raw, context), context)

        return grpc.unary_stream_rpc_method_handler(stream, response_serializer=serialize)

    def unary(raw: bytes, context):
        return behaviour(decoded(raw, context), context)

    return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)


def serve_unix(
    handlers: list[grpc.GenericRpcHandler], path: str, max_message_bytes: int, max_workers: int = 4
) -> grpc.Server:
    """A started server on the unix socket ``path``, refusing messages over ``max_message_bytes``."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers), handlers=handlers, options=options
    )
    try:
        bound = server.add_insecure_port(f"unix:{path}")
    except RuntimeError as exc:  # newer grpcio raises, older returns 0
        raise OSError(f"cannot listen on unix socket {path}: {exc}") from None
    if not bound:
        raise OSError(f"cannot listen on unix socket {path}")
    server.start()
    return server


# -- calling ----------------------------------------------------------------------------------------


def unix_channel(path: str, max_message_bytes: int) -> grpc.Channel:
    """A channel to the unix socket ``path`` (not connected yet: see ``wait_ready``)."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 0),  # a call is made once; the caller judges its outcome
    ]
    return grpc.insecure_channel(f"unix:{path}", options=options)


def wait_ready(channel: grpc.Channel, timeout_s: float, what: str) -> None:
    """Block until the channel is connected; TimeoutError names ``what`` was awaited."""
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        raise TimeoutError(f"{what}: not connected within {timeout_s:g} s") from None
    finally:
        ready.cancel()


def _unary(channel: grpc.Channel, method: Method):
    return channel.unary_unary(method.path, request_serializer=_encode)


def _encode(message: Message) -> bytes:
    return message.encode()


class RegistrationClient:
    """A plugin's view of the kubelet's Registration service."""

    def __init__(self, channel: grpc.Channel):
        self._register = _unary(channel, REGISTER)

    def register(self, request: RegisterRequest, *, timeout: float) -> Empty:
        return Empty.decode(self._register(request, timeout=timeout))


class ListAndWatchStream:
    """One open ListAndWatch call: iterate for messages, ``raw()`` for their bytes, ``cancel()``."""

    def __init__(self, call):
        self._call = call

    def __iter__(self) -> Iterator[ListAndWatchResponse]:
        for raw in self._call:
            yield ListAndWatchResponse.decode(raw)

    def raw(self) -> Iterator[bytes]:
        return iter(self._call)

    def cancel(self) -> None:
        self._call.cancel()


class DevicePluginClient:
    """The kubelet's view of a plugin. Every unary call takes a deadline (``timeout`` in s);
    a malformed answer raises WireError naming the field, a gRPC failure grpc.RpcError."""

    def __init__(self, channel: grpc.Channel):
        self._calls = {m.name: _unary(channel, m) for m in DEVICE_PLUGIN_METHODS if not m.server_streaming}
        self._list_and_watch = channel.unary_stream(LIST_AND_WATCH.path, request_serializer=_encode)

    def call(self, method: Method, request: Message, *, timeout: float) -> Message:
        """Any unary method of the service, by its ``Method``."""
        return method.response.decode(self._calls[method.name](request, timeout=timeout))

    def get_device_plugin_options(self, *, timeout: float) -> DevicePluginOptions:
        return self.call(GET_DEVICE_PLUGIN_OPTIONS, Empty(), timeout=timeout)

    def get_preferred_allocation(
        self, request: PreferredAllocationRequest, *, timeout: float
    ) -> PreferredAllocationResponse:
        return self.call(GET_PREFERRED_ALLOCATION, request, timeout=timeout)

    def allocate(self, request: AllocateRequest, *, timeout: float) -> AllocateResponse:
        return self.call(ALLOCATE, request, timeout=timeout)

    def pre_start_container(
        self, request: PreStartContainerRequest, *, timeout: float
    ) -> PreStartContainerResponse:
        return self.call(PRE_START_CONTAINER, request, timeout=timeout)

    def list_and_watch(self, *, timeout: float | None = None) -> ListAndWatchStream:
        """The device stream; no deadline by default (it lasts as long as the plugin)."""
        return ListAndWatchStream(self._list_and_watch(Empty(), timeout=timeout))
