"""The protobuf wire format, as much of it as the device-plugin API needs, in the standard library.

Why our own: the node (Debian 12) has python3-protobuf 3.21, generated code must not be
newer than the runtime that loads it, and the API is a few flat messages. So a message
class declares its fields (``FieldSpec``: number, name, kind, repeated) and the one
``encode`` / ``decode`` below do the rest.

Protobuf semantics where they make peers interoperate: unknown fields of every wire type
(groups included) are skipped, absent fields keep their defaults, the last value of a
scalar wins, a singular message field given twice is merged, repeated numbers are read
packed or not, map entries may lack key or value. Strict where the bytes are malformed:
a truncated field, a varint past 64 bits, invalid UTF-8 in a string, a field number out
of range, an invalid wire type, or a known field with a wire type its type never has
raise ``WireError`` naming the message and the field path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
_WIRE_TYPE_NAMES = {
    VARINT: "varint",
    I64: "64-bit",
    LEN: "length-delimited",
    SGROUP: "start-group",
    EGROUP: "end-group",
    I32: "32-bit",
}

# Field kinds (the API uses no others).
STRING, BOOL, INT32, INT64, MESSAGE, MAP = "string", "bool", "int32", "int64", "message", "map"
_NUMERIC = (BOOL, INT32, INT64)

MAX_FIELD_NUMBER = (1 << 29) - 1
MAX_GROUP_DEPTH = 100
_MASK64 = (1 << 64) - 1
_RANGES = {INT32: (-(1 << 31), (1 << 31) - 1), INT64: (-(1 << 63), (1 << 63) - 1)}


class WireError(ValueError):
    """Bytes that are not a valid encoding of a message (or a value that cannot be encoded).

    ``message`` is the proto name of the outermost message, ``field`` the path inside it
    (``container_responses[0].envs``; empty when the problem is the message's own framing).
    """

    def __init__(self, message: str, field: str, problem: str):
        self.message = message
        self.field = field
        self.problem = problem
        super().__init__(f"{message}.{field}: {problem}" if field else f"{message}: {problem}")


@dataclass(frozen=True)
class FieldSpec:
    number: int
    name: str
    kind: str
    repeated: bool = False
    message: Any = None  # for MESSAGE: the class (with proto_name, wire_fields(), cls(**values))


# -- primitives -------------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Base-128 varint of an unsigned 64-bit value (negative int64: pass it masked to 64 bits)."""
    if not 0 <= value <= _MASK64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data, pos: int) -> tuple[int, int]:
    """(value, position after it); ValueError says what is wrong (truncated, too long)."""
    result = shift = 0
    for i in range(10):
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        if i == 9 and byte > 1:
            raise ValueError("varint longer than 64 bits")
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def signed(value: int, bits: int) -> int:
    """A varint's low ``bits`` as two's complement (how int32/int64 are read)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _tag(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, LEN) + encode_varint(len(payload)) + payload


# -- encoding ---------------------------------------------------------------------------------------


def encode(obj) -> bytes:
    """The message's bytes: fields in number order, proto3 defaults left out, maps sorted by key."""
    name = obj.proto_name
    out = bytearray()
    for spec in obj.wire_fields():
        value = getattr(obj, spec.name)
        try:
            out += _encode_field(spec, value)
        except WireError as exc:
            raise WireError(name, _join(spec.name, exc), exc.problem) from None
        except (TypeError, ValueError) as exc:
            raise WireError(name, spec.name, f"cannot encode {value!r:.80}: {exc}") from None
    return bytes(out)


def _encode_field(spec: FieldSpec, value) -> bytes:
    if spec.kind == MAP:
        return _encode_map(spec, value)
    if not spec.repeated:
        return _encode_single(spec, value)
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError("a repeated field takes a sequence")
    if spec.kind in _NUMERIC:  # packed, proto3's default
        payload = b"".join(encode_varint(_scalar(spec, v)) for v in value)
        return _length_delimited(spec.number, payload) if payload else b""
    return b"".join(_encode_single(spec, v, keep_default=True) for v in value)


def _encode_single(spec: FieldSpec, value, keep_default: bool = False) -> bytes:
    if spec.kind == MESSAGE:
        if value is None and not keep_default:
            return b""
        if not isinstance(value, spec.message):
            raise TypeError(f"expected {spec.message.__name__}")
        return _length_delimited(spec.number, encode(value))
    if spec.kind == STRING:
        if not isinstance(value, str):
            raise TypeError("expected a str")
        if not value and not keep_default:
            return b""
        return _length_delimited(spec.number, value.encode("utf-8"))
    number = _scalar(spec, value)
    if not number and not keep_default:
        return b""
    return _tag(spec.number, VARINT) + encode_varint(number)


def _scalar(spec: FieldSpec, value) -> int:
    """A bool or integer as the unsigned 64-bit varint value protobuf writes for it."""
    if spec.kind == BOOL:
        if not isinstance(value, bool):
            raise TypeError("expected a bool")
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("expected an int")
    low, high = _RANGES[spec.kind]
    if not low <= value <= high:
        raise ValueError(f"outside {spec.kind}")
    return value & _MASK64  # a negative number is sign-extended to 10 bytes, int32 too


def _encode_map(spec: FieldSpec, value) -> bytes:
    if not isinstance(value, dict):
        raise TypeError("a map takes a dict")
    out = bytearray()
    for key in sorted(value):
        item = value[key]
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError("map<string, string> takes str keys and values")
        entry = _length_delimited(1, key.encode("utf-8")) + _length_delimited(2, item.encode("utf-8"))
        out += _length_delimited(spec.number, entry)
    return bytes(out)


# -- decoding ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MapEntry:
    """The entry message protobuf defines for a map<string, string> field."""

    key: str = ""
    value: str = ""
    proto_name = "MapEntry"
    _fields = (FieldSpec(1, "key", STRING), FieldSpec(2, "value", STRING))

    @classmethod
    def wire_fields(cls) -> tuple[FieldSpec, ...]:
        return cls._fields


def decode(cls, data):
    """An instance of ``cls`` from its bytes (``bytes``, ``bytearray`` or ``memoryview``)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return _Decoder(cls, view).run()


class _Decoder:
    """One pass over one message's bytes; nested messages get their own."""

    def __init__(self, cls, view: memoryview):
        self.cls = cls
        self.view = view
        self.name = cls.proto_name
        self.by_number = {spec.number: spec for spec in cls.wire_fields()}
        self.by_name = {spec.name: spec for spec in cls.wire_fields()}
        self.values: dict[str, Any] = {}
        self.repeated: dict[str, list] = {}
        self.message_parts: dict[str, list[memoryview]] = {}  # singular message fields, merged at the end

    def fail(self, field: str, problem: str) -> WireError:
        return WireError(self.name, field, problem)

    def run(self):
        view, pos, end = self.view, 0, len(self.view)
        while pos < end:
            try:
                tag, pos = read_varint(view, pos)
            except ValueError as exc:
                raise self.fail("", f"field tag at byte {pos}: {exc}") from None
            number, wire_type = tag >> 3, tag & 7
            if not 1 <= number <= MAX_FIELD_NUMBER:
                raise self.fail("", f"field number {number} out of range (tag before byte {pos})")
            spec = self.by_number.get(number)
            if wire_type not in _WIRE_TYPE_NAMES:
                raise self.fail(spec.name if spec else f"<field {number}>", f"invalid wire type {wire_type}")
            pos = self.skip(pos, number, wire_type) if spec is None else self.take(spec, wire_type, pos)
        for field_name, parts in self.message_parts.items():
            joined = parts[0] if len(parts) == 1 else memoryview(b"".join(bytes(p) for p in parts))
            self.values[field_name] = self.nested(self.by_name[field_name].message, joined, field_name)
        for field_name, items in self.repeated.items():
            self.values[field_name] = dict(items) if self.by_name[field_name].kind == MAP else tuple(items)
        return self.cls(**self.values)

    # -- one field ---------------------------------------------------------------------------------
    def take(self, spec: FieldSpec, wire_type: int, pos: int) -> int:
        expected = VARINT if spec.kind in _NUMERIC else LEN
        packed = spec.repeated and spec.kind in _NUMERIC and wire_type == LEN
        if wire_type != expected and not packed:
            raise self.fail(
                spec.name,
                f"{_WIRE_TYPE_NAMES[wire_type]} wire type where {spec.kind} is {_WIRE_TYPE_NAMES[expected]}",
            )
        if wire_type == VARINT:
            value, pos = self.varint(spec.name, pos)
            self.store(spec, self.number(spec, value))
            return pos
        payload, pos = self.payload(spec.name, pos)
        if packed:
            self.unpack(spec, payload)
        elif spec.kind == STRING:
            self.store(spec, self.text(spec.name, payload))
        elif spec.kind == MAP:
            index = len(self.repeated.get(spec.name, ()))
            entry = self.nested(_MapEntry, payload, f"{spec.name}[{index}]")
            self.repeated.setdefault(spec.name, []).append((entry.key, entry.value))
        elif spec.repeated:
            index = len(self.repeated.get(spec.name, ()))
            self.store(spec, self.nested(spec.message, payload, f"{spec.name}[{index}]"))
        else:
            self.message_parts.setdefault(spec.name, []).append(payload)
        return pos

    def store(self, spec: FieldSpec, value) -> None:
        if spec.repeated:
            self.repeated.setdefault(spec.name, []).append(value)
        else:
            self.values[spec.name] = value  # the last one wins

    def unpack(self, spec: FieldSpec, payload: memoryview) -> None:
        pos = 0
        while pos < len(payload):
            try:
                value, pos = read_varint(payload, pos)
            except ValueError as exc:
                raise self.fail(spec.name, f"packed values: {exc}") from None
            self.store(spec, self.number(spec, value))

    def number(self, spec: FieldSpec, value: int):
        if spec.kind == BOOL:
            return value != 0
        return signed(value, 32 if spec.kind == INT32 else 64)

    def nested(self, cls, payload: memoryview, path: str):
        try:
            return _Decoder(cls, payload).run()
        except WireError as exc:
            raise self.fail(_join(path, exc), exc.problem) from None

    # -- bytes ---------------------------------------------------------------------------------------
    def varint(self, label: str, pos: int) -> tuple[int, int]:
        try:
            return read_varint(self.view, pos)
        except ValueError as exc:
            raise self.fail(label, str(exc)) from None

    def payload(self, label: str, pos: int) -> tuple[memoryview, int]:
        length, pos = self.varint(label, pos)
        if length > len(self.view) - pos:
            raise self.fail(label, f"length {length} runs past the end ({len(self.view) - pos} bytes left)")
        return self.view[pos : pos + length], pos + length

    def text(self, label: str, payload: memoryview) -> str:
        try:
            return str(payload, "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(label, f"not valid UTF-8 (byte {exc.start} of the string)") from None

    def skip(self, pos: int, number: int, wire_type: int) -> int:
        """Step over an unknown field of any wire type (a group with everything inside it)."""
        view, label = self.view, f"<field {number}>"
        open_groups: list[int] = []  # field numbers of the groups we are inside
        while True:
            if wire_type == VARINT:
                _, pos = self.varint(label, pos)
            elif wire_type in (I64, I32):
                size = 8 if wire_type == I64 else 4
                if pos + size > len(view):
                    raise self.fail(label, f"truncated {_WIRE_TYPE_NAMES[wire_type]} value")
                pos += size
            elif wire_type == LEN:
                _, pos = self.payload(label, pos)
            elif wire_type == SGROUP:
                if len(open_groups) == MAX_GROUP_DEPTH:
                    raise self.fail(label, f"groups nested deeper than {MAX_GROUP_DEPTH}")
                open_groups.append(number)
            elif wire_type == EGROUP:
                if not open_groups or open_groups.pop() != number:
                    raise self.fail(label, f"end-group of field {number} without its start-group")
            else:
                raise self.fail(label, f"invalid wire type {wire_type}")
            if not open_groups:
                return pos
            if pos >= len(view):
                raise self.fail(label, "group without its end-group")
            tag, pos = self.varint(label, pos)
            number, wire_type = tag >> 3, tag & 7


def _join(path: str, exc: WireError) -> str:
    return f"{path}.{exc.field}" if exc.field else path
