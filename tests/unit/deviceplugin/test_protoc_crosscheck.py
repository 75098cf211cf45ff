"""Our .proto, our field tables and the official protobuf runtime agree, byte for byte both ways.

Why: real plugins are built from the kubelet's own api.proto with protoc; ours is written
from the documentation. Compiling ours with grpc_tools (a dev dependency) and crossing
bytes with the generated classes shows the field numbers, types and names of messages.py
are those of v1beta1.proto, and that the two codecs read each other. Skipped, with the
reason, where grpc_tools is not installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from dp_strategies import messages_of, sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hilconform.runtime.deviceplugin import grpc_api, messages
from hilconform.runtime.deviceplugin.messages import ALL_MESSAGES
from hilconform.runtime.deviceplugin.wire import BOOL, INT32, INT64, MAP, MESSAGE, STRING

protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is not installed (the dev extra)")
descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2", reason="protobuf is not installed")
from google.protobuf.descriptor import FieldDescriptor  # noqa: E402 (after the skip)

PROTO = Path(messages.__file__).with_name("v1beta1.proto")
NAMES = [cls.__name__ for cls in ALL_MESSAGES]
TYPES = {
    STRING: FieldDescriptor.TYPE_STRING,
    BOOL: FieldDescriptor.TYPE_BOOL,
    INT32: FieldDescriptor.TYPE_INT32,
    INT64: FieldDescriptor.TYPE_INT64,
    MESSAGE: FieldDescriptor.TYPE_MESSAGE,
    MAP: FieldDescriptor.TYPE_MESSAGE,
}


@pytest.fixture(scope="session")
def pb2(tmp_path_factory):
    """The module protoc generates from our v1beta1.proto (loaded once: it fills the default pool)."""
    out = tmp_path_factory.mktemp("protoc")
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", str(PROTO)])
    assert status == 0, "protoc refused runtime/deviceplugin/v1beta1.proto"
    spec = importlib.util.spec_from_file_location("v1beta1_pb2", out / "v1beta1_pb2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def to_pb(message, pb_message):
    for spec in message.wire_fields():
        value = getattr(message, spec.name)
        target = getattr(pb_message, spec.name)
        if spec.kind == MAP:
            target.update(value)
        elif spec.kind == MESSAGE and spec.repeated:
            for item in value:
                to_pb(item, target.add())
        elif spec.kind == MESSAGE:
            if value is not None:
                target.SetInParent()
                to_pb(value, target)
        elif spec.repeated:
            target.extend(value)
        else:
            setattr(pb_message, spec.name, value)
    return pb_message


def from_pb(cls, pb_message):
    values = {}
    for spec in cls.wire_fields():
        value = getattr(pb_message, spec.name)
        if spec.kind == MAP:
            values[spec.name] = dict(value)
        elif spec.kind == MESSAGE and spec.repeated:
            values[spec.name] = tuple(from_pb(spec.message, item) for item in value)
        elif spec.kind == MESSAGE:
            values[spec.name] = from_pb(spec.message, value) if pb_message.HasField(spec.name) else None
        else:
            values[spec.name] = tuple(value) if spec.repeated else value
    return cls(**values)


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_field_tables_match_the_compiled_proto(pb2, cls):
    descriptor = pb2.DESCRIPTOR.message_types_by_name[cls.__name__]
    theirs = {f.name: (f.number, f.type, is_repeated(f)) for f in descriptor.fields}
    ours = {s.name: (s.number, TYPES[s.kind], s.repeated or s.kind == MAP) for s in cls.wire_fields()}
    assert ours == theirs
    for spec in cls.wire_fields():
        field = descriptor.fields_by_name[spec.name]
        if spec.kind == MAP:
            assert field.message_type.GetOptions().map_entry
        elif spec.kind == MESSAGE:
            assert field.message_type.name == spec.message.__name__


def test_every_message_of_the_proto_has_a_class(pb2):
    assert set(pb2.DESCRIPTOR.message_types_by_name) == set(NAMES)


def test_services_match_the_compiled_proto(pb2):
    ours = {
        (m.service, m.name): (m.request.__name__, m.response.__name__, m.server_streaming)
        for m in grpc_api.REGISTRATION_METHODS + grpc_api.DEVICE_PLUGIN_METHODS
    }
    theirs = {}
    for service in pb2.DESCRIPTOR.services_by_name.values():
        proto = descriptor_pb2.ServiceDescriptorProto()
        service.CopyToProto(proto)
        for method in proto.method:
            key = (f"v1beta1.{service.name}", method.name)
            theirs[key] = (
                method.input_type.rsplit(".", 1)[-1],
                method.output_type.rsplit(".", 1)[-1],
                method.server_streaming,
            )
            assert not method.client_streaming
    assert ours == theirs


def cross(pb2, message) -> None:
    cls = type(message)
    pb_class = getattr(pb2, cls.__name__)
    theirs = pb_class()
    theirs.ParseFromString(message.encode())
    assert from_pb(cls, theirs) == message, "protobuf read our bytes differently"
    official = to_pb(message, pb_class()).SerializeToString()
    assert cls.decode(official) == message, "we read protobuf's bytes differently"


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_bytes_cross_both_ways_with_every_field_set(pb2, cls):
    cross(pb2, sample(cls))
    cross(pb2, cls())


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(ALL_MESSAGES).flatmap(messages_of))
def test_generated_messages_cross_both_ways(pb2, message):
    cross(pb2, message)


def test_unknown_fields_from_a_newer_peer_are_skipped(pb2):
    """A plugin built against a later API may send fields we do not know: protobuf keeps
    them, we skip them, and the known fields still arrive."""
    newer = pb2.Device(ID="gpu0", health="Healthy").SerializeToString() + bytes([0xA2, 0x06, 0x01, 0x78])
    assert messages.Device.decode(newer) == messages.Device("gpu0", "Healthy")
