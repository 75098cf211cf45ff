"""Every message of the API round-trips through our codec, for chosen and for generated values."""

from __future__ import annotations

import json

import pytest
from dp_strategies import messages_of, sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hilconform.runtime.deviceplugin.messages import (
    ALL_MESSAGES,
    AllocateRequest,
    ContainerAllocateRequest,
    Device,
    ListAndWatchResponse,
)

NAMES = [cls.__name__ for cls in ALL_MESSAGES]


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_every_message_round_trips_with_every_field_set(cls):
    message = sample(cls)
    data = message.encode()
    assert cls.decode(data) == message
    assert cls.decode(memoryview(data)) == message
    assert cls.decode(bytearray(data)) == message
    if cls.wire_fields():
        assert data, f"{cls.__name__} with every field set encodes to something"


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_field_tables_have_distinct_numbers_and_names(cls):
    numbers = [spec.number for spec in cls.wire_fields()]
    assert numbers == sorted(set(numbers))
    assert cls.proto_name == f"v1beta1.{cls.__name__}"


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_MESSAGES).flatmap(messages_of))
def test_decode_of_encode_is_the_identity(message):
    assert type(message).decode(message.encode()) == message


@settings(max_examples=25)
@given(st.sampled_from(ALL_MESSAGES).flatmap(messages_of))
def test_to_json_is_plain_json(message):
    assert json.loads(json.dumps(message.to_json())) is not None


def test_lists_given_by_a_caller_become_tuples():
    request = AllocateRequest([ContainerAllocateRequest(["a", "b"])])
    assert request == AllocateRequest((ContainerAllocateRequest(("a", "b")),))
    assert AllocateRequest.decode(request.encode()) == request


def test_the_api_field_names_are_kept():
    record = ListAndWatchResponse([Device("gpu0", "Healthy")]).to_json()
    assert record == {"devices": [{"ID": "gpu0", "health": "Healthy", "topology": None}]}
