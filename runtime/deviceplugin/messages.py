"""The API's messages as frozen dataclasses; each field's declaration is its row of the schema.

Why one table per message, in the dataclass itself: the field number, kind and default
sit beside the name, so adding a field is one line, and ``wire.encode`` / ``wire.decode``
serve every message alike (no per-message code to drift from v1beta1.proto; the unit
tests compare both). Names are the API's, ``ID`` and ``available_deviceIDs`` included,
so a record reads like the kubelet's logs. Repeated fields are tuples, maps are dicts,
an absent message field is None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from . import wire
from .wire import BOOL, INT32, INT64, MAP, MESSAGE, STRING, FieldSpec

PACKAGE = "v1beta1"


def pb(number: int, kind: str, message: type | None = None, repeated: bool = False):
    """A dataclass field carrying its wire spec, with protobuf's default as its default."""
    spec = {"number": number, "kind": kind, "message": message, "repeated": repeated}
    if kind == MAP:
        return dataclasses.field(default_factory=dict, metadata={"wire": spec})
    if repeated:
        default = ()
    else:
        default = {STRING: "", BOOL: False, INT32: 0, INT64: 0, MESSAGE: None}[kind]
    return dataclasses.field(default=default, metadata={"wire": spec})


class Message:
    """Base of every API message: its schema, ``encode()`` and ``decode(data)``."""

    proto_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.proto_name = f"{PACKAGE}.{cls.__name__}"

    @classmethod
    def wire_fields(cls) -> tuple[FieldSpec, ...]:
        table = cls.__dict__.get("_wire_table")
        if table is None:
            table = tuple(
                sorted(
                    (FieldSpec(name=f.name, **f.metadata["wire"]) for f in dataclasses.fields(cls)),
                    key=lambda spec: spec.number,
                )
            )
            cls._wire_table = table
        return table

    def __post_init__(self):
        # lists given by a caller become tuples, so equality and immutability hold
        for spec in self.wire_fields():
            value = getattr(self, spec.name)
            if spec.repeated and isinstance(value, list):
                object.__setattr__(self, spec.name, tuple(value))

    def encode(self) -> bytes:
        return wire.encode(self)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview):
        """The message from its bytes; WireError names the field when they are malformed."""
        return wire.decode(cls, data)

    def to_json(self) -> dict:
        """Plain JSON types (for records and the control protocol): what ``dataclasses.asdict``
        gives, with lists for repeated fields."""
        return {spec.name: _plain(getattr(self, spec.name)) for spec in self.wire_fields()}


def _plain(value):
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return dict(value)
    return value


@dataclass(frozen=True)
class Empty(Message):
    pass


@dataclass(frozen=True)
class DevicePluginOptions(Message):
    pre_start_required: bool = pb(1, BOOL)
    get_preferred_allocation_available: bool = pb(2, BOOL)


@dataclass(frozen=True)
class RegisterRequest(Message):
    version: str = pb(1, STRING)
    endpoint: str = pb(2, STRING)
    resource_name: str = pb(3, STRING)
    options: DevicePluginOptions | None = pb(4, MESSAGE, DevicePluginOptions)


@dataclass(frozen=True)
class NUMANode(Message):
    ID: int = pb(1, INT64)


@dataclass(frozen=True)
class TopologyInfo(Message):
    nodes: tuple[NUMANode, ...] = pb(1, MESSAGE, NUMANode, repeated=True)


@dataclass(frozen=True)
class Device(Message):
    ID: str = pb(1, STRING)
    health: str = pb(2, STRING)
    topology: TopologyInfo | None = pb(3, MESSAGE, TopologyInfo)


@dataclass(frozen=True)
class ListAndWatchResponse(Message):
    devices: tuple[Device, ...] = pb(1, MESSAGE, Device, repeated=True)


@dataclass(frozen=True)
class PreStartContainerRequest(Message):
    devices_ids: tuple[str, ...] = pb(1, STRING, repeated=True)


@dataclass(frozen=True)
class PreStartContainerResponse(Message):
    pass


@dataclass(frozen=True)
class ContainerPreferredAllocationRequest(Message):
    available_deviceIDs: tuple[str, ...] = pb(1, STRING, repeated=True)
    must_include_deviceIDs: tuple[str, ...] = pb(2, STRING, repeated=True)
    allocation_size: int = pb(3, INT32)


@dataclass(frozen=True)
class PreferredAllocationRequest(Message):
    container_requests: tuple[ContainerPreferredAllocationRequest, ...] = pb(
        1, MESSAGE, ContainerPreferredAllocationRequest, repeated=True
    )


@dataclass(frozen=True)
class ContainerPreferredAllocationResponse(Message):
    deviceIDs: tuple[str, ...] = pb(1, STRING, repeated=True)


@dataclass(frozen=True)
class PreferredAllocationResponse(Message):
    container_responses: tuple[ContainerPreferredAllocationResponse, ...] = pb(
        1, MESSAGE, ContainerPreferredAllocationResponse, repeated=True
    )


@dataclass(frozen=True)
class ContainerAllocateRequest(Message):
    devices_ids: tuple[str, ...] = pb(1, STRING, repeated=True)


@dataclass(frozen=True)
class AllocateRequest(Message):
    container_requests: tuple[ContainerAllocateRequest, ...] = pb(
        1, MESSAGE, ContainerAllocateRequest, repeated=True
    )


@dataclass(frozen=True)
class CDIDevice(Message):
    name: str = pb(1, STRING)


@dataclass(frozen=True)
class Mount(Message):
    container_path: str = pb(1, STRING)
    host_path: str = pb(2, STRING)
    read_only: bool = pb(3, BOOL)


@dataclass(frozen=True)
class DeviceSpec(Message):
    container_path: str = pb(1, STRING)
    host_path: str = pb(2, STRING)
    permissions: str = pb(3, STRING)


@dataclass(frozen=True)
class ContainerAllocateResponse(Message):
    envs: dict[str, str] = pb(1, MAP)
    mounts: tuple[Mount, ...] = pb(2, MESSAGE, Mount, repeated=True)
    devices: tuple[DeviceSpec, ...] = pb(3, MESSAGE, DeviceSpec, repeated=True)
    annotations: dict[str, str] = pb(4, MAP)
    cdi_devices: tuple[CDIDevice, ...] = pb(5, MESSAGE, CDIDevice, repeated=True)


@dataclass(frozen=True)
class AllocateResponse(Message):
    container_responses: tuple[ContainerAllocateResponse, ...] = pb(
        1, MESSAGE, ContainerAllocateResponse, repeated=True
    )


ALL_MESSAGES: tuple[type[Message], ...] = (
    Empty,
    DevicePluginOptions,
    RegisterRequest,
    NUMANode,
    TopologyInfo,
    Device,
    ListAndWatchResponse,
    PreStartContainerRequest,
    PreStartContainerResponse,
    ContainerPreferredAllocationRequest,
    PreferredAllocationRequest,
    ContainerPreferredAllocationResponse,
    PreferredAllocationResponse,
    ContainerAllocateRequest,
    AllocateRequest,
    CDIDevice,
    Mount,
    DeviceSpec,
    ContainerAllocateResponse,
    AllocateResponse,
)
