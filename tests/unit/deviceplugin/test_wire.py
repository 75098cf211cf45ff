"""The wire codec: protobuf semantics where peers need them, a named WireError where bytes are malformed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hilconform.runtime.deviceplugin import wire
from hilconform.runtime.deviceplugin.messages import (
    AllocateResponse,
    ContainerAllocateResponse,
    Device,
    DevicePluginOptions,
    ListAndWatchResponse,
    Message,
    NUMANode,
    RegisterRequest,
    pb,
)
from hilconform.runtime.deviceplugin.wire import INT64, WireError, encode_varint, read_varint


@dataclass(frozen=True)
class Numbers(Message):
    """A test-only message: the API has no repeated int64, the codec supports it anyway."""

    values: tuple[int, ...] = pb(1, INT64, repeated=True)
    one: int = pb(2, INT64)


def tag(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


def ld(number: int, payload: bytes) -> bytes:
    return tag(number, wire.LEN) + encode_varint(len(payload)) + payload


# -- varints and integers -------------------------------------------------------------------------------


@given(st.integers(0, 2**64 - 1))
def test_varint_round_trip(value):
    data = encode_varint(value)
    assert read_varint(data, 0) == (value, len(data))
    assert len(data) <= 10


def test_negative_int64_is_a_ten_byte_varint_as_protobuf_writes_it():
    data = NUMANode(ID=-1).encode()
    assert data == bytes([0x08]) + b"\xff" * 9 + b"\x01"
    assert NUMANode.decode(data) == NUMANode(ID=-1)


def test_int64_range_is_enforced_when_encoding():
    with pytest.raises(WireError, match=r"v1beta1.NUMANode.ID: cannot encode .*outside int64"):
        NUMANode(ID=2**63).encode()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x08", "truncated varint"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "varint longer than"),
        (b"\x08" + b"\xff" * 9 + b"\x02", "varint longer than 64 bits"),
    ],
)
def test_malformed_varints_name_the_field(data, problem):
    with pytest.raises(WireError, match=f"v1beta1.NUMANode.ID: {problem}"):
        NUMANode.decode(data)


def test_repeated_int64_is_read_packed_and_unpacked_and_written_packed():
    unpacked = tag(1, wire.VARINT) + encode_varint(5) + tag(1, wire.VARINT) + encode_varint(2**64 - 3)
    packed = ld(1, encode_varint(7) + encode_varint(8))
    assert Numbers.decode(unpacked + packed).values == (5, -3, 7, 8)
    assert Numbers(values=(1, -1)).encode() == ld(1, encode_varint(1) + encode_varint(2**64 - 1))
    assert Numbers().encode() == b""


def test_truncated_packed_values_name_the_field():
    with pytest.raises(WireError, match=r"Numbers.values: packed values: truncated varint"):
        Numbers.decode(ld(1, b"\x01\x80"))


# -- protobuf semantics ----------------------------------------------------------------------------------


def test_absent_fields_are_defaults_and_defaults_are_not_written():
    assert Device.decode(b"") == Device(ID="", health="", topology=None)
    assert Device().encode() == b""
    assert DevicePluginOptions(False, False).encode() == b""


def test_unknown_fields_of_every_wire_type_are_skipped():
    unknown = (
        tag(9, wire.VARINT) + encode_varint(300)
        + tag(10, wire.I64) + b"\x00" * 8
        + ld(11, b"whatever")
        + tag(12, wire.I32) + b"\x00" * 4
        + tag(13, wire.SGROUP) + tag(1, wire.VARINT) + b"\x01"
        + tag(14, wire.SGROUP) + tag(14, wire.EGROUP) + tag(13, wire.EGROUP)
    )  # fmt: skip
    data = unknown + ld(1, b"gpu0") + unknown + ld(2, b"Healthy")
    assert Device.decode(data) == Device(ID="gpu0", health="Healthy")


def test_the_last_scalar_wins_and_a_message_given_twice_is_merged():
    data = ld(1, b"a") + ld(1, b"b")
    assert Device.decode(data).ID == "b"
    first = ld(4, tag(1, wire.VARINT) + b"\x01")
    second = ld(4, tag(2, wire.VARINT) + b"\x01")
    options = RegisterRequest.decode(first + second).options
    assert options == DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


def test_map_entries_may_lack_key_or_value_and_the_last_key_wins():
    entries = ld(1, ld(1, b"A")) + ld(1, ld(2, b"only-value")) + ld(1, ld(1, b"A") + ld(2, b"2"))
    response = ContainerAllocateResponse.decode(entries)
    assert response.envs == {"A": "2", "": "only-value"}


def test_maps_are_written_in_key_order():
    one = ContainerAllocateResponse(envs={"b": "2", "a": "1"}).encode()
    assert one == ContainerAllocateResponse(envs={"a": "1", "b": "2"}).encode()
    assert one.index(b"a") < one.index(b"b")


# -- malformed bytes name the field ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "data", "message"),
    [
        (Device, ld(1, b"ab")[:-1], r"v1beta1.Device.ID: length 2 runs past the end \(1 bytes left\)"),
        (Device, ld(2, b"\xff"), r"v1beta1.Device.health: not valid UTF-8"),
        (Device, tag(1, wire.VARINT) + b"\x01", r"v1beta1.Device.ID: varint wire type where string is "),
        (Device, tag(1, 6), r"v1beta1.Device.ID: invalid wire type 6"),
        (Device, tag(0, wire.VARINT) + b"\x00", r"v1beta1.Device: field number 0 out of range"),
        (
            Device,
            tag(9, wire.EGROUP),
            r"v1beta1.Device.<field 9>: end-group of field 9 without its start-group",
        ),
        (Device, tag(9, wire.SGROUP), r"v1beta1.Device.<field 9>: group without its end-group"),
        (Device, tag(9, wire.I64) + b"\x00", r"v1beta1.Device.<field 9>: truncated 64-bit value"),
        (Device, b"\x80", r"v1beta1.Device: field tag at byte 0: truncated varint"),
        (
            ListAndWatchResponse,
            ld(1, ld(3, ld(1, tag(1, wire.VARINT) + b"\x80"))),
            r"v1beta1.ListAndWatchResponse.devices\[0\].topology.nodes\[0\].ID: truncated varint",
        ),
        (
            AllocateResponse,
            ld(1, b"") + ld(1, ld(4, ld(2, b"\xc3"))),
            r"v1beta1.AllocateResponse.container_responses\[1\].annotations\[0\].value: not valid UTF-8",
        ),
    ],
)
def test_malformed_bytes_raise_a_wire_error_naming_message_and_field(cls, data, message):
    with pytest.raises(WireError, match=message) as caught:
        cls.decode(data)
    assert isinstance(caught.value, ValueError)


def test_groups_nested_too_deep_are_refused():
    data = tag(9, wire.SGROUP) * (wire.MAX_GROUP_DEPTH + 1)
    with pytest.raises(WireError, match="nested deeper"):
        Device.decode(data)


def test_values_of_the_wrong_type_cannot_be_encoded():
    with pytest.raises(WireError, match=r"v1beta1.Device.ID: cannot encode 5"):
        Device(ID=5).encode()
    with pytest.raises(WireError, match=r"v1beta1.ListAndWatchResponse.devices: cannot encode"):
        ListAndWatchResponse(devices=(NUMANode(1),)).encode()


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_wire_error_only(data):
    for cls in (ListAndWatchResponse, AllocateResponse, RegisterRequest):
        try:
            cls.decode(data)
        except WireError:
            pass
