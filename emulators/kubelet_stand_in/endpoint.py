"""The kubelet's connection to one registered plugin: a channel, and the ListAndWatch reader.

Why one class: the kubelet dials the plugin's socket while it handles Register (giving
up after a deadline), then reads ListAndWatch on its own thread until the stream ends,
and never opens it again: when it ends, the connection is closed and the manager is
told why. Unary calls (Allocate, …) go over the same channel with a deadline each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from hilconform.runtime.deviceplugin import grpc_api
from hilconform.runtime.deviceplugin.messages import DevicePluginOptions, ListAndWatchResponse, Message
from hilconform.runtime.deviceplugin.wire import WireError

_log = logging.getLogger("hilconform.kubelet_stand_in")

OnUpdate = Callable[
    ["PluginEndpoint", ListAndWatchResponse, int, int], None
]  # (endpoint, message, ts_ns, bytes)
OnEnd = Callable[["PluginEndpoint", str], None]  # (endpoint, reason)


def rpc_error_text(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'UNKNOWN'}: {details}"


class PluginEndpoint:
    def __init__(self, resource: str, socket_path: str, max_message_bytes: int):
        self.resource = resource
        self.socket_path = socket_path
        self._channel = grpc_api.unix_channel(socket_path, max_message_bytes)
        self._client = grpc_api.DevicePluginClient(self._channel)
        self._stream: grpc_api.ListAndWatchStream | None = None
        self._thread: threading.Thread | None = None
        self._closing: str | None = None
        self._lock = threading.Lock()

    def connect(self, dial_timeout_s: float, call_timeout_s: float) -> DevicePluginOptions:
        """Dial the plugin and ask its options, as the kubelet does before answering Register.

        TimeoutError, grpc.RpcError or WireError say what failed."""
        grpc_api.wait_ready(self._channel, dial_timeout_s, f"plugin socket {self.socket_path}")
        return self._client.get_device_plugin_options(timeout=call_timeout_s)

    def call(self, method: grpc_api.Method, request: Message, timeout_s: float) -> Message:
        return self._client.call(method, request, timeout=timeout_s)

    def start_watch(self, on_update: OnUpdate, on_end: OnEnd) -> None:
        """Open ListAndWatch once; its reader thread reports every message and then the end.

        Started under the lock `close` takes: a registration that replaces this one (the plugin
        registering again after its first Register timed out) joins a started thread or none."""
        with self._lock:
            self._thread = threading.Thread(
                target=self._watch, args=(on_update, on_end), name=f"lw:{self.resource}"[:15], daemon=True
            )
            self._thread.start()

    def _watch(self, on_update: OnUpdate, on_end: OnEnd) -> None:
        reason = "the plugin ended the stream"
        try:
            with self._lock:
                if self._closing is None:
                    self._stream = self._client.list_and_watch()
            if self._stream is not None:
                for raw in self._stream.raw():
                    ts_ns = time.monotonic_ns()
                    try:
                        message = ListAndWatchResponse.decode(raw)
                    except WireError as exc:
                        reason = f"malformed ListAndWatchResponse: {exc}"
                        break
                    on_update(self, message, ts_ns, len(raw))
        except grpc.RpcError as exc:
            reason = f"stream failed: {rpc_error_text(exc)}"
        except Exception as exc:  # a reader must end by reporting, whatever broke
            reason = f"stand-in error while reading: {exc!r}"
            _log.exception("ListAndWatch reader of %s failed", self.resource)
        finally:
            with self._lock:
                if self._closing is not None:
                    reason = self._closing
            self._close_channel()
            on_end(self, reason)

    def close(self, reason: str, join_s: float = 5.0) -> None:
        """End the stream and the connection (the reader reports ``reason`` as the end)."""
        with self._lock:
            if self._closing is None:
                self._closing = reason
            stream = self._stream
            thread = self._thread
        if stream is not None:
            stream.cancel()
        if thread is None:
            self._close_channel()
        elif thread is not threading.current_thread():
            thread.join(join_s)
            if thread.is_alive():
                _log.warning(
                    "ListAndWatch reader of %s still running %.0f s after close", self.resource, join_s
                )

    def _close_channel(self) -> None:
        try:
            self._channel.close()
        except Exception as exc:  # closing must not mask why the connection ended
            _log.debug("closing the channel to %s: %r", self.socket_path, exc)
