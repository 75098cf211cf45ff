"""The runtime protocol: versioned JSON lines (requests, replies, events).

Why one module: the host side (fixtures, suites, adapters for third-party
runtimes) imports it to build requests and to validate what a runtime says,
so it depends on nothing but the standard library and imports alone.
docs/protocol.md is the human description of the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_LINE_BYTES = 64 * 1024

# Error codes (error.code). Stable strings: clients match on them.
PARSE_ERROR = "PARSE_ERROR"  # not JSON, not UTF-8, or not an object
INVALID_REQUEST = "INVALID_REQUEST"  # missing/ill-typed v, id or method
UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
LINE_TOO_LONG = "LINE_TOO_LONG"
UNKNOWN_METHOD = "UNKNOWN_METHOD"
INVALID_PARAMS = "INVALID_PARAMS"
UNKNOWN_DEVICE = "UNKNOWN_DEVICE"
UNKNOWN_LEASE = "UNKNOWN_LEASE"
NOT_HEALTHY = "NOT_HEALTHY"  # allocate of a device that is not HEALTHY
DEVICE_BUSY = "DEVICE_BUSY"  # held by a lease, or a procedure runs on it
INSUFFICIENT_DEVICES = "INSUFFICIENT_DEVICES"  # fewer HEALTHY devices of the class than asked
INVALID_STATE = "INVALID_STATE"  # operation makes no sense in the device's state
SHUTTING_DOWN = "SHUTTING_DOWN"
TOO_MANY_CLIENTS = "TOO_MANY_CLIENTS"  # connection past max_clients: this line, then the runtime closes it
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # the runtime lacked its own fds/memory to check; retry
INTERNAL = "INTERNAL"

ERROR_CODES = (
    PARSE_ERROR,
    INVALID_REQUEST,
    UNSUPPORTED_VERSION,
    LINE_TOO_LONG,
    UNKNOWN_METHOD,
    INVALID_PARAMS,
    UNKNOWN_DEVICE,
    UNKNOWN_LEASE,
    NOT_HEALTHY,
    DEVICE_BUSY,
    INSUFFICIENT_DEVICES,
    INVALID_STATE,
    SHUTTING_DOWN,
    TOO_MANY_CLIENTS,
    RESOURCE_EXHAUSTED,
    INTERNAL,
)

# Number ranges (docs/protocol.md, Methods): a number outside is INVALID_PARAMS, so no
# parameter reaches float conversion unchecked (an integer of 10**309 has no float).
MAX_TTL_S = 86400
MAX_COUNT = 1024
MAX_SEQ = 2**63 - 1
MAX_VERSION = 2**31 - 1
MAX_VERSIONS = 64  # entries of hello.versions
# param -> (lowest, highest, lowest excluded)
NUMBER_RANGES: dict[str, tuple[int, int, bool]] = {
    "ttl_s": (0, MAX_TTL_S, True),
    "count": (1, MAX_COUNT, False),
    "since_seq": (0, MAX_SEQ, False),
}

_STR = (str,)
_INT = (int,)
_NUM = (int, float)
_BOOL = (bool,)
_LIST = (list,)

# method -> {param: (accepted JSON types, required)}. Unknown params are refused.
METHODS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "hello": {"versions": (_LIST, False), "client": (_STR, False)},
    "inventory": {},
    "device": {"device": (_STR, True)},
    "transitions": {},
    "subscribe": {"events": (_LIST, False), "since_seq": (_INT, False)},
    "unsubscribe": {},
    "allocate": {
        "device": (_STR, False),
        "class": (_STR, False),
        "count": (_INT, False),
        "holder": (_STR, False),
        "ttl_s": (_NUM, False),
    },
    "renew": {"lease": (_STR, True), "ttl_s": (_NUM, False)},
    "release": {"lease": (_STR, True)},
    "leases": {},
    "remove": {"device": (_STR, True)},
    "reset": {"device": (_STR, True), "force": (_BOOL, False)},
    "recover": {"device": (_STR, True)},
    "health_poll": {"device": (_STR, False)},
    "stats": {},
    "shutdown": {},
}

# event name -> data fields every such event carries (more may follow).
EVENTS: dict[str, tuple[str, ...]] = {
    "transition": ("device", "view", "from", "to", "cause", "checkpoint", "ts_ns"),
    "discovered": ("device", "info", "cause", "udev_received_ns"),
    "removed": ("device", "cause"),
    "topology": ("generation", "devices", "cause"),
    "procedure": ("procedure", "run", "device", "step", "status", "ts_ns"),
    "deallocate": ("device", "lease", "holder", "reason"),
    "lease": ("lease", "holder", "devices", "action", "expires_ns"),
    "aer": ("device", "kind"),
    "reset": ("device", "outcome", "duration_ms", "source"),
    "kernel": ("kind", "line"),
    "identity_changed": ("device", "location", "fingerprint"),
    "inventory_complete": ("devices", "duration_ms"),
    "dropped": ("count",),
    "shutdown": ("reason",),
}


class ProtocolError(Exception):
    """A request that cannot be served; becomes an error reply with ``code``."""

    def __init__(self, code: str, message: str, req_id: Any = None, data: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.req_id = req_id
        self.data = data


@dataclass(frozen=True)
class Request:
    id: int | str
    method: str
    params: dict = field(default_factory=dict)


def encode(message: dict) -> bytes:
    """One JSON line (ASCII only, so any transport carries it)."""
    return (json.dumps(message, separators=(",", ":"), ensure_ascii=True, allow_nan=False) + "\n").encode(
        "ascii"
    )


def request(req_id: int | str, method: str, params: dict | None = None) -> dict:
    return {"v": PROTOCOL_VERSION, "id": req_id, "method": method, "params": params or {}}


def reply(req_id: Any, result: Any) -> dict:
    return {"v": PROTOCOL_VERSION, "id": req_id, "result": result}


def error(req_id: Any, code: str, message: str, data: dict | None = None) -> dict:
    err: dict[str, Any] = {"code": code, "message": message}
    if data:
        err["data"] = data
    return {"v": PROTOCOL_VERSION, "id": req_id, "error": err}


def event(name: str, seq: int, ts_ns: int, data: dict) -> dict:
    return {"v": PROTOCOL_VERSION, "event": name, "seq": seq, "ts_ns": ts_ns, "data": data}


def _valid_id(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true is not a number here
    if isinstance(value, float) and float in types:
        return value == value and value not in (float("inf"), float("-inf"))
    return isinstance(value, types)


def _load_object(line: bytes | str) -> dict:
    return load_json_object(line, ProtocolError)


def load_json_object(line: bytes | str, error: Callable[[str, str], Exception],
                     max_line_bytes: int = MAX_LINE_BYTES) -> dict:
    """One JSON-lines message as a dict, read strictly (UTF-8, no NaN/Infinity, an object);
    `error(code, message)` makes what is raised (code PARSE_ERROR or LINE_TOO_LONG). Shared by
    every JSON-lines channel of the project (the kubelet stand-in's control too)."""
    if isinstance(line, (bytes, bytearray)):
        if len(line) > max_line_bytes:
            raise error(LINE_TOO_LONG, f"line longer than {max_line_bytes} bytes")
        try:
            line = bytes(line).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(PARSE_ERROR, f"not UTF-8: {exc.reason}") from None
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise error(PARSE_ERROR, f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise error(PARSE_ERROR, "a message is a JSON object")
    return obj


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def decode_request(line: bytes | str) -> Request:
    """Parse and validate one request line; ProtocolError says why not (with the id when known)."""
    obj = _load_object(line)
    req_id = obj.get("id")
    if not _valid_id(req_id):
        raise ProtocolError(INVALID_REQUEST, "id must be an integer or a string")
    version = obj.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProtocolError(INVALID_REQUEST, "v must be an integer", req_id)
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            UNSUPPORTED_VERSION,
            f"protocol version {str(version)[:20]} not supported",
            req_id,
            {"supported": list(SUPPORTED_VERSIONS)},
        )
    method = obj.get("method")
    if not isinstance(method, str):
        raise ProtocolError(INVALID_REQUEST, "method must be a string", req_id)
    extra = set(obj) - {"v", "id", "method", "params"}
    if extra:
        raise ProtocolError(INVALID_REQUEST, f"unknown request field(s): {sorted(extra)[:5]}", req_id)
    spec = METHODS.get(method)
    if spec is None:
        raise ProtocolError(UNKNOWN_METHOD, f"unknown method {method[:64]!r}", req_id)
    params = obj.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError(INVALID_PARAMS, "params must be an object", req_id)
    for name, value in params.items():
        if name not in spec:
            raise ProtocolError(INVALID_PARAMS, f"{method}: unknown param {str(name)[:64]!r}", req_id)
        types, _required = spec[name]
        if not _type_ok(value, types):
            raise ProtocolError(
                INVALID_PARAMS, f"{method}: param {name!r} must be {_type_names(types)}", req_id
            )
        problem = _range_problem(name, value)
        if problem:
            raise ProtocolError(INVALID_PARAMS, f"{method}: param {name!r} {problem}", req_id)
    for name, (_types, required) in spec.items():
        if required and name not in params:
            raise ProtocolError(INVALID_PARAMS, f"{method}: param {name!r} is required", req_id)
    return Request(req_id, method, dict(params))


def _range_problem(name: str, value: Any) -> str | None:
    """Why a well-typed param is out of its range (None when it is in range)."""
    if name == "versions":
        if len(value) > MAX_VERSIONS:
            return f"lists at most {MAX_VERSIONS} versions"
        if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_VERSION for v in value):
            return f"must list integers from 1 to {MAX_VERSION}"
        return None
    bounds = NUMBER_RANGES.get(name)
    if bounds is None:
        return None
    low, high, low_excluded = bounds
    if (value <= low if low_excluded else value < low) or value > high:
        return f"must be {'>' if low_excluded else '>='} {low} and <= {high}"
    return None


def _type_names(types: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def decode_message(line: bytes | str) -> dict:
    """Host side: parse one line from a runtime and check it is a valid reply, error or event.

    Returns the message with an added key "kind" ("reply", "error" or "event").
    """
    obj = _load_object(line)
    if obj.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(INVALID_REQUEST, f"v must be {PROTOCOL_VERSION}")
    if "event" in obj:
        validate_event(obj)
        return {**obj, "kind": "event"}
    if "id" not in obj or not (obj["id"] is None or _valid_id(obj["id"])):
        raise ProtocolError(INVALID_REQUEST, "reply without a valid id")
    if ("result" in obj) == ("error" in obj):
        raise ProtocolError(INVALID_REQUEST, "a reply has exactly one of result, error")
    if "error" in obj:
        err = obj["error"]
        if (
            not isinstance(err, dict)
            or not isinstance(err.get("code"), str)
            or not isinstance(err.get("message"), str)
        ):
            raise ProtocolError(INVALID_REQUEST, "error must be {code: str, message: str}")
        return {**obj, "kind": "error"}
    return {**obj, "kind": "reply"}


def validate_event(obj: dict) -> None:
    """Raise ProtocolError unless ``obj`` is a well-formed event (known name, fields present)."""
    name = obj.get("event")
    if name not in EVENTS:
        raise ProtocolError(INVALID_REQUEST, f"unknown event {name!r}")
    for key, types in (("seq", _INT), ("ts_ns", _INT), ("data", (dict,))):
        if not _type_ok(obj.get(key), types):
            raise ProtocolError(INVALID_REQUEST, f"event {name}: {key} missing or ill-typed")
    missing = [f for f in EVENTS[name] if f not in obj["data"]]
    if missing:
        raise ProtocolError(INVALID_REQUEST, f"event {name}: data lacks {missing}")
