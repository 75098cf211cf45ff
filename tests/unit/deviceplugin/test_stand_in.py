"""The kubelet stand-in end to end: a real grpcio plugin on a real unix socket, in a temp plugin dir."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from types import SimpleNamespace

import grpc
import pytest
from dp_fake_plugin import END, FakePlugin
from dp_waits import records_of, wait_record

from hilconform.emulators.kubelet_stand_in import control
from hilconform.emulators.kubelet_stand_in.control import ControlError, Request
from hilconform.emulators.kubelet_stand_in.control_server import Dispatcher
from hilconform.emulators.kubelet_stand_in.device_manager import KubeletStandIn
from hilconform.emulators.kubelet_stand_in.records import RecordStore
from hilconform.runtime.deviceplugin import grpc_api
from hilconform.runtime.deviceplugin.messages import Device, DevicePluginOptions, RegisterRequest

RESOURCE = "example.com/gpu"


@pytest.fixture
def plugin_dir():
    """Short (unix socket paths are limited to ~107 bytes), removed afterwards."""
    path = tempfile.mkdtemp(prefix="dp", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_kubelet(plugin_dir):
    started = []

    def make(**kwargs) -> KubeletStandIn:
        kwargs.setdefault("dial_timeout_s", 1.0)
        kwargs.setdefault("call_timeout_s", 5.0)
        stand_in = KubeletStandIn(plugin_dir, **kwargs)
        stand_in.start()
        started.append(stand_in)
        return stand_in

    yield make
    for stand_in in started:
        stand_in.stop()


@pytest.fixture
def kubelet(make_kubelet) -> KubeletStandIn:
    return make_kubelet()


@pytest.fixture
def make_plugin(plugin_dir):
    plugins = []

    def make(**kwargs) -> FakePlugin:
        plugin = FakePlugin(plugin_dir, **kwargs).start()
        plugins.append(plugin)
        return plugin

    yield make
    for plugin in plugins:
        plugin.stop()


def registered(kubelet: KubeletStandIn, plugin: FakePlugin) -> dict:
    """Register and wait until the stream is open (the plugin saw its ListAndWatch call)."""
    plugin.register()
    assert plugin.watch_opened.acquire(timeout=5), "ListAndWatch was not opened within 5 s"
    return kubelet.state()["resources"][plugin.resource]


def socket_file(path: str) -> None:
    """Leave a stale unix socket at ``path``, as a plugin that died leaves its own."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()


# -- registration ---------------------------------------------------------------------------------------


def test_a_registration_is_accepted_after_the_options_and_recorded_in_order(kubelet, make_plugin):
    plugin = make_plugin()
    state = registered(kubelet, plugin)
    assert plugin.options_before_register_returned is True, (
        "GetDevicePluginOptions came after Register returned"
    )
    kinds = [r["kind"] for r in records_of(kubelet.records, resource=RESOURCE)]
    assert kinds[:3] == ["register_request", "options", "register_accepted"]
    request = records_of(kubelet.records, "register_request")[0]["message"]
    assert request == {
        "version": "v1beta1",
        "endpoint": "fake.sock",
        "resource_name": RESOURCE,
        "options": {"pre_start_required": False, "get_preferred_allocation_available": True},
    }
    assert state["registered"] and state["stream_open"] and state["endpoint"] == "fake.sock"
    assert state["options"] == {"pre_start_required": False, "get_preferred_allocation_available": True}
    accepted = records_of(kubelet.records, "register_accepted")[0]
    assert accepted["endpoint"] == plugin.socket_path and isinstance(accepted["ts_ns"], int)


def test_a_wrong_version_is_refused_and_recorded(kubelet, make_plugin):
    plugin = make_plugin()
    with pytest.raises(grpc.RpcError) as refused:
        plugin.register(version="v1alpha")
    assert refused.value.code() == grpc.StatusCode.UNKNOWN and "'v1alpha'" in refused.value.details()
    reason = wait_record(kubelet.records, "register_refused", RESOURCE)["reason"]
    assert "API version 'v1alpha' is not supported" in reason
    assert kubelet.state()["resources"] == {}
    assert plugin.calls == [], "a refused plugin is never dialled"


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/gpu", "Example.com/gpu"])
def test_an_invalid_resource_name_is_refused_and_recorded(kubelet, make_plugin, name):
    plugin = make_plugin()
    with pytest.raises(grpc.RpcError) as refused:
        plugin.register(resource=name)
    assert f"resource name {name!r} is invalid" in refused.value.details()
    assert wait_record(kubelet.records, "register_refused", name)["reason"] == refused.value.details()
    assert kubelet.state()["resources"] == {}


def test_an_endpoint_nobody_serves_is_refused_after_the_dial_deadline(kubelet, make_plugin):
    plugin = make_plugin()
    with pytest.raises(grpc.RpcError) as refused:
        plugin.register(endpoint="nobody.sock")
    assert "cannot dial the plugin" in refused.value.details()
    assert "not connected within 1 s" in wait_record(kubelet.records, "register_refused")["reason"]


def test_failing_options_refuse_the_registration(kubelet, make_plugin):
    class NoOptions(FakePlugin):
        def GetDevicePluginOptions(self, request, context):
            context.abort(grpc.StatusCode.INTERNAL, "options broke")

    plugin = NoOptions(kubelet.plugin_dir, socket_name="noopt.sock").start()
    try:
        with pytest.raises(grpc.RpcError) as refused:
            plugin.register()
        assert "GetDevicePluginOptions failed: INTERNAL: options broke" in refused.value.details()
    finally:
        plugin.stop()


def test_a_malformed_register_request_is_answered_invalid_argument_and_recorded(kubelet):
    channel = grpc.insecure_channel(f"unix:{kubelet.socket_path}")
    try:
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary(grpc_api.REGISTER.path)(b"\x0a\x01\xff", timeout=5)
    finally:
        channel.close()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "v1beta1.RegisterRequest.version: not valid UTF-8" in refused.value.details()
    record = wait_record(kubelet.records, "malformed")
    assert record["method"] == "/v1beta1.Registration/Register"


def test_a_new_registration_of_the_resource_replaces_the_old_one(kubelet, make_plugin):
    first, second = make_plugin(socket_name="one.sock"), make_plugin(socket_name="two.sock")
    registered(kubelet, first)
    state = registered(kubelet, second)
    end = wait_record(kubelet.records, "stream_end", RESOURCE)
    assert end["reason"] == "replaced by a new registration of the same resource"
    assert state["endpoint"] == "two.sock" and state["registrations"] == 2 and state["stream_open"]
    second.push_ids(["x"])
    wait_record(kubelet.records, "list_and_watch", RESOURCE)
    assert kubelet.state()["resources"][RESOURCE]["healthy"] == ["x"]


# -- ListAndWatch ---------------------------------------------------------------------------------------


def test_list_and_watch_messages_set_capacity_and_allocatable(kubelet, make_plugin):
    plugin = make_plugin()
    registered(kubelet, plugin)
    plugin.push_ids(["a", "b"], unhealthy=["c"])
    first = wait_record(kubelet.records, "list_and_watch", RESOURCE)
    assert (first["capacity"], first["allocatable"]) == (3, 2)
    assert first["message"]["devices"][2] == {"ID": "c", "health": "Unhealthy", "topology": None}
    state = kubelet.state()["resources"][RESOURCE]
    assert (state["capacity"], state["allocatable"]) == (3, 2)
    assert state["healthy"] == ["a", "b"] and state["unhealthy"] == ["c"] and state["updates"] == 1
    plugin.push_ids(["a"])
    second = wait_record(kubelet.records, "list_and_watch", RESOURCE, lambda r: r["capacity"] == 1)
    assert second["ts_ns"] >= first["ts_ns"] and second["seq"] > first["seq"]
    state = kubelet.state()["resources"][RESOURCE]
    assert (state["capacity"], state["allocatable"], state["updates"]) == (1, 1, 2)


def test_a_stream_that_ends_is_recorded_and_never_reopened(kubelet, make_plugin):
    plugin = make_plugin()
    registered(kubelet, plugin)
    plugin.updates.put(END)
    end = wait_record(kubelet.records, "stream_end", RESOURCE)
    assert end["reason"] == "the plugin ended the stream"
    state = kubelet.state()["resources"][RESOURCE]
    assert not state["stream_open"] and state["stream_end_reason"] == end["reason"] and state["registered"]
    assert not plugin.watch_opened.acquire(timeout=0.5), "the stand-in opened ListAndWatch again"
    assert plugin.watch_calls == 1
    with pytest.raises(ControlError) as refused:
        Dispatcher(kubelet).handle(Request(1, "allocate", {"resource": RESOURCE, "containers": [["a"]]}))
    assert (
        refused.value.code == control.NOT_CONNECTED and "the plugin ended the stream" in refused.value.message
    )


def test_a_message_over_the_size_limit_ends_the_stream(make_kubelet, make_plugin):
    kubelet = make_kubelet(max_message_bytes=64 * 1024)
    plugin = make_plugin()
    registered(kubelet, plugin)
    plugin.push(Device("x" * 70_000, "Healthy"))
    end = wait_record(kubelet.records, "stream_end", RESOURCE)
    assert "RESOURCE_EXHAUSTED" in end["reason"]
    assert records_of(kubelet.records, "list_and_watch") == []


def test_a_malformed_list_and_watch_message_ends_the_stream_naming_the_field(kubelet):
    def options(raw, context):
        return b""

    def list_and_watch(raw, context):
        yield b"\x0a\x03\x0a\x01\xff"  # devices[0].ID is not UTF-8

    handler = grpc.method_handlers_generic_handler(
        grpc_api.DEVICE_PLUGIN_SERVICE,
        {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(options),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(list_and_watch),
        },
    )
    server = grpc_api.serve_unix([handler], os.path.join(kubelet.plugin_dir, "raw.sock"), 1 << 20)
    channel = grpc.insecure_channel(f"unix:{kubelet.socket_path}")
    try:
        grpc_api.RegistrationClient(channel).register(
            RegisterRequest("v1beta1", "raw.sock", RESOURCE, DevicePluginOptions()), timeout=5
        )
        end = wait_record(kubelet.records, "stream_end", RESOURCE)
    finally:
        channel.close()
        server.stop(grace=0).wait(5)
    assert end["reason"] == (
        "malformed ListAndWatchResponse: v1beta1.ListAndWatchResponse.devices[0].ID: "
        "not valid UTF-8 (byte 0 of the string)"
    )


def test_a_flood_of_list_and_watch_keeps_the_records_bounded(make_kubelet, make_plugin):
    kubelet = make_kubelet(records=RecordStore(per_stream=20))
    plugin = make_plugin()
    registered(kubelet, plugin)
    for i in range(400):
        plugin.push_ids([f"d{i}"])
    wait_record(
        kubelet.records,
        "list_and_watch",
        RESOURCE,
        lambda r: r["message"]["devices"][0]["ID"] == "d399",
        timeout_s=20,
    )
    assert len(records_of(kubelet.records, "list_and_watch")) == 20
    assert kubelet.state()["dropped"] == [{"resource": RESOURCE, "kind": "list_and_watch", "dropped": 380}]
    assert records_of(kubelet.records, "register_accepted"), "the flood pushed out the registration"
    assert kubelet.state()["resources"][RESOURCE]["updates"] == 400


# -- kubelet restart and start -----------------------------------------------------------------------------


def test_a_kubelet_restart_removes_the_sockets_and_the_plugin_registers_again(kubelet, make_plugin):
    plugin = make_plugin()
    registered(kubelet, plugin)
    started = kubelet.restart()
    assert not os.path.exists(plugin.socket_path), "the plugin's socket survived the restart"
    assert "fake.sock" in started["removed_sockets"] and started["generation"] == 2
    assert os.path.exists(kubelet.socket_path)
    assert wait_record(kubelet.records, "stream_end", RESOURCE)["reason"] == "kubelet restart"
    state = kubelet.state()
    assert state["generation"] == 2 and state["serving"]
    assert not state["resources"][RESOURCE]["registered"] and not state["resources"][RESOURCE]["stream_open"]
    plugin.stop()  # as a plugin does when its socket disappears: serve again, register again
    plugin.start()
    state = registered(kubelet, plugin)
    assert state["registered"] and state["stream_open"] and state["registrations"] == 2


def test_stale_sockets_are_removed_at_start_and_nothing_else(plugin_dir):
    socket_file(os.path.join(plugin_dir, "old.sock"))
    socket_file(os.path.join(plugin_dir, "kubelet.sock"))
    with open(os.path.join(plugin_dir, "kubelet_internal_checkpoint"), "w") as fh:
        fh.write("{}")
    os.mkdir(os.path.join(plugin_dir, "sub"))
    socket_file(os.path.join(plugin_dir, "sub", "in.sock"))
    os.symlink("kubelet_internal_checkpoint", os.path.join(plugin_dir, "link.sock"))
    stand_in = KubeletStandIn(plugin_dir)
    try:
        started = stand_in.start()
        assert sorted(started["removed_sockets"]) == ["kubelet.sock", "old.sock"]
        assert sorted(os.listdir(plugin_dir)) == [
            "kubelet.sock",
            "kubelet_internal_checkpoint",
            "link.sock",
            "sub",
        ]
        assert os.listdir(os.path.join(plugin_dir, "sub")) == ["in.sock"]
        record = records_of(stand_in.records, "kubelet_start")[0]
        assert record["removed_sockets"] == started["removed_sockets"] and record["cause"] == "start"
    finally:
        stand_in.stop()
    assert not os.path.exists(os.path.join(plugin_dir, "kubelet.sock")), "stop leaves kubelet.sock behind"


def test_the_plugin_directory_is_created(plugin_dir):
    stand_in = KubeletStandIn(os.path.join(plugin_dir, "a", "b"))
    try:
        assert stand_in.start()["removed_sockets"] == []
        assert os.path.exists(os.path.join(plugin_dir, "a", "b", "kubelet.sock"))
    finally:
        stand_in.stop()


# -- calls through the control interface --------------------------------------------------------------


def test_allocate_preferred_allocation_and_prestart_reach_the_plugin_and_are_recorded(kubelet, make_plugin):
    plugin = make_plugin()
    registered(kubelet, plugin)
    plugin.push_ids(["a", "b"])
    wait_record(kubelet.records, "list_and_watch", RESOURCE)
    dispatcher = Dispatcher(kubelet)

    answer = dispatcher.handle(Request(1, "allocate", {"resource": RESOURCE, "containers": [["a"], ["b"]]}))
    first, second = answer["response"]["container_responses"]
    assert first["envs"] == {"FAKE_DEVICES": "a"} and second["devices"][0]["host_path"] == "/dev/fakeb"
    assert records_of(kubelet.records, "allocate_request")[0]["message"]["container_requests"][1] == {
        "devices_ids": ["b"]
    }
    assert records_of(kubelet.records, "allocate_response")[0]["message"] == answer["response"]

    with pytest.raises(ControlError) as refused:
        dispatcher.handle(Request(2, "allocate", {"resource": RESOURCE, "containers": [["nope"]]}))
    assert refused.value.code == control.PLUGIN_ERROR
    assert refused.value.data["grpc_code"] == "INVALID_ARGUMENT" and "nope" in refused.value.data["details"]
    assert records_of(kubelet.records, "allocate_error")[0]["grpc_code"] == "INVALID_ARGUMENT"

    preferred = dispatcher.handle(
        Request(
            3,
            "preferred_allocation",
            {"resource": RESOURCE, "containers": [{"available": ["b", "a"], "size": 1}]},
        )
    )
    assert preferred["response"] == {"container_responses": [{"deviceIDs": ["b"]}]}

    with pytest.raises(ControlError) as not_offered:
        dispatcher.handle(Request(4, "prestart", {"resource": RESOURCE, "devices": ["a"]}))
    assert not_offered.value.code == control.NOT_OFFERED and "pre_start_required" in not_offered.value.message
    forced = dispatcher.handle(
        Request(5, "prestart", {"resource": RESOURCE, "devices": ["a"], "force": True})
    )
    assert forced == {"response": {}}
    assert [name for name, _ in plugin.calls].count("PreStartContainer") == 1

    with pytest.raises(ControlError) as unknown:
        dispatcher.handle(Request(6, "allocate", {"resource": "example.com/none", "containers": [["a"]]}))
    assert unknown.value.code == control.UNKNOWN_RESOURCE and "example.com/none" in unknown.value.message


def test_a_plugin_that_does_not_answer_in_time_is_a_timeout_naming_the_call(kubelet, make_plugin):
    answer_now = threading.Event()

    class Slow(FakePlugin):
        def Allocate(self, request, context):
            answer_now.wait(5)  # hold the answer past the stand-in's deadline
            return super().Allocate(request, context)

    plugin = Slow(kubelet.plugin_dir, socket_name="slow.sock").start()
    try:
        registered(kubelet, plugin)
        with pytest.raises(ControlError) as late:
            Dispatcher(kubelet).handle(
                Request(1, "allocate", {"resource": RESOURCE, "containers": [["a"]], "timeout_s": 0.3})
            )
        assert late.value.code == control.TIMEOUT
        assert late.value.message == f"no answer to Allocate from the plugin of {RESOURCE} within 0.3 s"
        assert records_of(kubelet.records, "allocate_error")[0]["code"] == control.TIMEOUT
    finally:
        answer_now.set()
        plugin.stop()


def test_an_endpoint_replaced_before_its_reader_starts_ends_once_with_the_reason(tmp_path):
    """The plugin registers again while the stand-in still answers its first Register (which
    timed out on the plugin's side): the first endpoint is closed before or while its
    ListAndWatch reader starts, and must end with the reason, never crash Register."""
    from hilconform.emulators.kubelet_stand_in.endpoint import PluginEndpoint

    # A plugin socket that takes connections and never answers: the stream is still opening when
    # the close comes (with no socket at all it could fail first, and that would be its reason).
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(8)
    for close_first in (True, False):
        endpoint = PluginEndpoint("example.com/gpu", str(tmp_path / "silent.sock"), 1 << 20)
        ended = []
        done = threading.Event()
        on_end = lambda ep, reason, ended=ended, done=done: (ended.append(reason), done.set())  # noqa: E731
        if close_first:
            endpoint.close("replaced by a new registration of the same resource")
            endpoint.start_watch(lambda *a: None, on_end)
        else:
            endpoint.start_watch(lambda *a: None, on_end)
            endpoint.close("replaced by a new registration of the same resource")
        assert done.wait(10)
        assert ended == ["replaced by a new registration of the same resource"]
    silent.close()


def test_a_close_racing_the_start_of_the_reader_never_joins_an_unstarted_thread(tmp_path, monkeypatch):
    """The window the crash came from, made wide: the replacing registration's close() runs
    between the reader thread's creation and its start. close() must wait for the start (or find
    no thread) and never raises; the reader ends once."""
    from hilconform.emulators.kubelet_stand_in import endpoint as endpoint_module

    endpoint = endpoint_module.PluginEndpoint("example.com/gpu", str(tmp_path / "nobody.sock"), 1 << 20)
    close_errors, ended, done = [], [], threading.Event()

    def close_from_another_registration():
        try:
            endpoint.close("replaced by a new registration of the same resource")
        except Exception as exc:  # the bug: RuntimeError("cannot join thread before it is started")
            close_errors.append(exc)

    real_thread = threading.Thread

    closers = []

    class ThreadClosedBeforeStart(real_thread):
        def start(self):
            closers.append(real_thread(target=close_from_another_registration))
            closers[0].start()
            closers[0].join(0.5)  # close() runs now, unless start_watch holds the lock it needs
            super().start()

    # Only the endpoint module sees the patched class (gRPC's own threads stay as they are).
    monkeypatch.setattr(endpoint_module, "threading", SimpleNamespace(
        Thread=ThreadClosedBeforeStart, current_thread=threading.current_thread, Lock=threading.Lock))
    endpoint.start_watch(lambda *a: None, lambda ep, reason: (ended.append(reason), done.set()))
    closers[0].join(10)
    assert done.wait(10)
    assert close_errors == []
    assert len(ended) == 1  # the reader ended once (nobody serves the socket: its reason may be that)
