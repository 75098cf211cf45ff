"""The stand-in's control protocol: JSON lines between the host and the kubelet stand-in.

Why one module: the host side (fixtures, suites, a developer's script) imports it to
build requests and read replies, the stand-in to check them, and neither needs grpcio
for that (standard library only). docs/device-plugins.md describes the same rules.

A request is ``{"id": <int|str>, "method": <name>, "params": {...}}`` (``"v": 1`` may be
given); a reply ``{"v": 1, "id": …, "result": …}`` or ``{"v": 1, "id": …, "error":
{"code", "message"[, "data"]}}``; replies may come out of order (a slow plugin call does
not hold up ``records``). The stand-in writes one unsolicited line when it is ready:
``{"v": 1, "event": "ready", "data": {...}}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hilconform.runtime.protocol import (  # noqa: F401 - its codes and line encoding are the control channel's too
    LINE_TOO_LONG,
    PARSE_ERROR,
    encode,
    load_json_object,
)

CONTROL_VERSION = 1
MAX_LINE_BYTES = 64 * 1024
DEFAULT_RECORDS_PER_REPLY = 500
MAX_RECORDS_PER_REPLY = 5000
DEFAULT_CALL_TIMEOUT_S = 10.0
MAX_CALL_TIMEOUT_S = 300.0
MAX_CONTAINERS = 64
MAX_IDS = 1024
MAX_ID_CHARS = 256
MAX_SEQ = 2**63 - 1
MAX_INT32 = 2**31 - 1

# Error codes (error.code): stable strings, clients match on them.
# PARSE_ERROR (not UTF-8, not JSON, not an object) and LINE_TOO_LONG: as the runtime's protocol
INVALID_REQUEST = "INVALID_REQUEST"  # id, v or method missing or ill-typed, unknown keys
UNKNOWN_METHOD = "UNKNOWN_METHOD"
INVALID_PARAMS = "INVALID_PARAMS"
UNKNOWN_RESOURCE = "UNKNOWN_RESOURCE"  # no plugin ever registered that resource with this kubelet
NOT_CONNECTED = "NOT_CONNECTED"  # registered, but its stream ended (or a restart dropped it)
NOT_OFFERED = "NOT_OFFERED"  # the plugin's options do not offer the call (force: true calls anyway)
PLUGIN_ERROR = "PLUGIN_ERROR"  # the plugin answered with a gRPC error (data: grpc_code, details)
TIMEOUT = "TIMEOUT"  # no answer within the call's deadline
MALFORMED_REPLY = "MALFORMED_REPLY"  # the plugin's answer did not decode
INTERNAL = "INTERNAL"

# What each record kind stands for (records.py describes the record itself).
RECORD_KINDS: dict[str, str] = {
    "kubelet_start": "the stand-in served a new kubelet.sock (extra: generation, removed_sockets, cause)",
    "kubelet_stop": "the stand-in stopped serving (extra: reason)",
    "register_request": "a Register call arrived (message: RegisterRequest)",
    "register_refused": "Register was answered with an error (extra: reason)",
    "options": "the plugin answered GetDevicePluginOptions during its Register (message)",
    "register_accepted": "Register succeeded (extra: endpoint, the socket path dialled)",
    "list_and_watch": "one ListAndWatch message (message; extra: capacity, allocatable, bytes)",
    "stream_end": "the ListAndWatch stream ended and is not re-opened (extra: reason)",
    "malformed": "a request to kubelet.sock that did not decode (extra: method, reason)",
    "allocate_request": "Allocate called (message: AllocateRequest)",
    "allocate_response": "Allocate answered (message: AllocateResponse)",
    "allocate_error": "Allocate failed (extra: code, reason[, grpc_code, details])",
    "preferred_allocation_request": "GetPreferredAllocation called (message)",
    "preferred_allocation_response": "GetPreferredAllocation answered (message)",
    "preferred_allocation_error": "GetPreferredAllocation failed (extra as allocate_error)",
    "prestart_request": "PreStartContainer called (message)",
    "prestart_response": "PreStartContainer answered (message)",
    "prestart_error": "PreStartContainer failed (extra as allocate_error)",
}


class ControlError(Exception):
    """A request that cannot be served; becomes an error reply with ``code``."""

    def __init__(self, code: str, message: str, data: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


@dataclass(frozen=True)
class Request:
    id: int | str
    method: str
    params: dict = field(default_factory=dict)


# -- params -----------------------------------------------------------------------------------------

Check = Callable[[Any], "str | None"]  # the problem with a value, None when it is fine


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _resource(value) -> str | None:
    if not isinstance(value, str) or not value or len(value) > 512:
        return "must be a resource name (a non-empty string of at most 512 characters)"
    return None


def _int_in(low: int, high: int) -> Check:
    def check(value):
        if not _is_int(value) or not low <= value <= high:
            return f"must be an integer from {low} to {high}"
        return None

    return check


def _timeout(value) -> str | None:
    ok = (_is_int(value) or isinstance(value, float)) and 0 < value <= MAX_CALL_TIMEOUT_S
    return None if ok else f"must be a number of seconds above 0 and at most {MAX_CALL_TIMEOUT_S:g}"


def _bool(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _ids(value) -> str | None:
    if not isinstance(value, list) or len(value) > MAX_IDS:
        return f"must be a list of at most {MAX_IDS} device IDs"
    if not all(isinstance(v, str) and len(v) <= MAX_ID_CHARS for v in value):
        return f"must list device IDs as strings of at most {MAX_ID_CHARS} characters"
    return None


def _containers_of(item: Check, what: str) -> Check:
    def check(value):
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_CONTAINERS:
            return f"must be a list of 1 to {MAX_CONTAINERS} containers, each {what}"
        for index, entry in enumerate(value):
            problem = item(entry)
            if problem:
                return f"[{index}] {problem}"
        return None

    return check


PREFERRED_KEYS: dict[str, tuple[Check, bool]] = {
    "available": (_ids, True),
    "must_include": (_ids, False),
    "size": (_int_in(0, MAX_INT32), True),
}


def _preferred_container(value) -> str | None:
    if not isinstance(value, dict):
        return "must be an object {available, must_include, size}"
    return _object_problem(value, PREFERRED_KEYS)


def _object_problem(value: dict, spec: dict[str, tuple[Check, bool]], noun: str = "key") -> str | None:
    for key, item in value.items():
        if key not in spec:
            return f"unknown {noun} {str(key)[:64]!r} (known: {', '.join(spec) or 'none'})"
        problem = spec[key][0](item)
        if problem:
            return f"{noun} {key!r} {problem}"
    missing = [key for key, (_check, required) in spec.items() if required and key not in value]
    return f"{noun} {missing[0]!r} is required" if missing else None


# method -> {param: (check, required)}. Unknown params are refused.
METHODS: dict[str, dict[str, tuple[Check, bool]]] = {
    "records": {
        "since_seq": (_int_in(0, MAX_SEQ), False),
        "max": (_int_in(1, MAX_RECORDS_PER_REPLY), False),
    },
    "state": {},
    "allocate": {
        "resource": (_resource, True),
        "containers": (_containers_of(_ids, "a list of device IDs"), True),
        "timeout_s": (_timeout, False),
    },
    "preferred_allocation": {
        "resource": (_resource, True),
        "containers": (_containers_of(_preferred_container, "{available, must_include, size}"), True),
        "timeout_s": (_timeout, False),
        "force": (_bool, False),
    },
    "prestart": {
        "resource": (_resource, True),
        "devices": (_ids, True),
        "timeout_s": (_timeout, False),
        "force": (_bool, False),
    },
    "restart_kubelet": {},
    "stop": {},
}


# -- lines ------------------------------------------------------------------------------------------


def request(req_id: int | str, method: str, params: dict | None = None) -> dict:
    return {"v": CONTROL_VERSION, "id": req_id, "method": method, "params": params or {}}


def reply(req_id: Any, result: Any) -> dict:
    return {"v": CONTROL_VERSION, "id": req_id, "result": result}


def error(req_id: Any, code: str, message: str, data: dict | None = None) -> dict:
    err: dict[str, Any] = {"code": code, "message": message}
    if data:
        err["data"] = data
    return {"v": CONTROL_VERSION, "id": req_id, "error": err}


def event(name: str, data: dict) -> dict:
    return {"v": CONTROL_VERSION, "event": name, "data": data}


def _load_object(line: bytes | str) -> dict:
    return load_json_object(line, ControlError, MAX_LINE_BYTES)


def request_id(line: bytes | str) -> Any:
    """The id of a request line when it has a usable one (to answer an invalid request)."""
    try:
        value = _load_object(line).get("id")
    except ControlError:
        return None
    return value if _is_int(value) or isinstance(value, str) else None


def decode_request(line: bytes | str) -> Request:
    """Parse and check one request line; ControlError says what is wrong."""
    obj = _load_object(line)
    req_id = obj.get("id")
    if not (_is_int(req_id) or isinstance(req_id, str)):
        raise ControlError(INVALID_REQUEST, "id must be an integer or a string")
    if "v" in obj and obj["v"] != CONTROL_VERSION:
        raise ControlError(INVALID_REQUEST, f"v must be {CONTROL_VERSION} (or left out)")
    extra = set(obj) - {"v", "id", "method", "params"}
    if extra:
        raise ControlError(INVALID_REQUEST, f"unknown request key(s): {sorted(extra)[:5]}")
    method = obj.get("method")
    if not isinstance(method, str):
        raise ControlError(INVALID_REQUEST, "method must be a string")
    spec = METHODS.get(method)
    if spec is None:
        raise ControlError(UNKNOWN_METHOD, f"unknown method {method[:64]!r}; known: {sorted(METHODS)}")
    params = obj.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ControlError(INVALID_PARAMS, f"{method}: params must be an object")
    problem = _object_problem(params, spec, "param")
    if problem:
        raise ControlError(INVALID_PARAMS, f"{method}: {problem}")
    return Request(req_id, method, dict(params))


def decode_reply(line: bytes | str) -> dict:
    """Host side: one line from the stand-in, with an added ``kind``: reply, error or event."""
    obj = _load_object(line)
    if obj.get("v") != CONTROL_VERSION:
        raise ControlError(INVALID_REQUEST, f"v must be {CONTROL_VERSION}")
    if "event" in obj:
        if not isinstance(obj.get("event"), str) or not isinstance(obj.get("data"), dict):
            raise ControlError(INVALID_REQUEST, "an event has a name and a data object")
        return {**obj, "kind": "event"}
    if ("result" in obj) == ("error" in obj):
        raise ControlError(INVALID_REQUEST, "a reply has exactly one of result, error")
    if "error" in obj:
        err = obj["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), str):
            raise ControlError(INVALID_REQUEST, "error must be {code: str, message: str}")
        return {**obj, "kind": "error"}
    return {**obj, "kind": "reply"}
