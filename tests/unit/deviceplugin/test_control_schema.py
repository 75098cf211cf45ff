"""The control protocol's schema: what a request may say, and errors that name what was wrong."""

from __future__ import annotations

import json

import pytest

from hilconform.emulators.kubelet_stand_in import control
from hilconform.emulators.kubelet_stand_in.control import ControlError, decode_reply, decode_request


def line(obj) -> bytes:
    return json.dumps(obj).encode()


def test_a_valid_request_is_decoded():
    req = decode_request(
        line(
            {
                "id": 7,
                "method": "allocate",
                "params": {"resource": "example.com/gpu", "containers": [["a", "b"], []]},
            }
        )
    )
    assert (req.id, req.method, req.params["containers"]) == (7, "allocate", [["a", "b"], []])
    assert decode_request(line(control.request("x", "state"))).params == {}


@pytest.mark.parametrize(
    ("raw", "code", "says"),
    [
        (b"{nope", control.PARSE_ERROR, "not JSON"),
        (b"\xff", control.PARSE_ERROR, "not UTF-8"),
        (b"[1]", control.PARSE_ERROR, "a JSON object"),
        (b'{"id": NaN, "method": "state"}', control.PARSE_ERROR, "NaN is not JSON"),
        (b"x" * (control.MAX_LINE_BYTES + 1), control.LINE_TOO_LONG, "longer than"),
        (line({"method": "state"}), control.INVALID_REQUEST, "id must be"),
        (line({"id": True, "method": "state"}), control.INVALID_REQUEST, "id must be"),
        (line({"id": 1, "v": 2, "method": "state"}), control.INVALID_REQUEST, "v must be 1"),
        (line({"id": 1, "method": "state", "extra": 1}), control.INVALID_REQUEST, "unknown request key"),
        (line({"id": 1, "method": "reboot"}), control.UNKNOWN_METHOD, "unknown method 'reboot'"),
        (
            line({"id": 1, "method": "state", "params": []}),
            control.INVALID_PARAMS,
            "params must be an object",
        ),
        (line({"id": 1, "method": "state", "params": {"x": 1}}), control.INVALID_PARAMS, "unknown param 'x'"),
        (
            line({"id": 1, "method": "allocate", "params": {"containers": [[]]}}),
            control.INVALID_PARAMS,
            "param 'resource' is required",
        ),
        (
            line({"id": 1, "method": "allocate", "params": {"resource": "r", "containers": [["a", 5]]}}),
            control.INVALID_PARAMS,
            "param 'containers' [0] must list device IDs",
        ),
        (
            line({"id": 1, "method": "allocate", "params": {"resource": "r", "containers": []}}),
            control.INVALID_PARAMS,
            "list of 1 to 64 containers",
        ),
        (
            line(
                {
                    "id": 1,
                    "method": "preferred_allocation",
                    "params": {"resource": "r", "containers": [{"available": [], "size": -1}]},
                }
            ),
            control.INVALID_PARAMS,
            "[0] key 'size' must be an integer from 0",
        ),
        (
            line(
                {
                    "id": 1,
                    "method": "preferred_allocation",
                    "params": {"resource": "r", "containers": [{"size": 1}]},
                }
            ),
            control.INVALID_PARAMS,
            "key 'available' is required",
        ),
        (
            line(
                {"id": 1, "method": "prestart", "params": {"resource": "r", "devices": ["a"], "timeout_s": 0}}
            ),
            control.INVALID_PARAMS,
            "'timeout_s' must be a number of seconds above 0",
        ),
        (
            line({"id": 1, "method": "records", "params": {"since_seq": -1}}),
            control.INVALID_PARAMS,
            "'since_seq' must be an integer from 0",
        ),
    ],
)
def test_bad_requests_are_refused_naming_what_was_wrong(raw, code, says):
    with pytest.raises(ControlError) as refused:
        decode_request(raw)
    assert refused.value.code == code
    assert says in refused.value.message


def test_the_id_of_a_bad_request_is_found_when_it_has_one():
    assert control.request_id(line({"id": 3, "method": "reboot"})) == 3
    assert control.request_id(b"{nope") is None


def test_replies_and_events_are_read_back_on_the_host_side():
    assert decode_reply(control.encode(control.reply(1, {"a": 1})))["kind"] == "reply"
    err = decode_reply(control.encode(control.error(2, control.UNKNOWN_RESOURCE, "no such", {"x": 1})))
    assert err["kind"] == "error" and err["error"]["data"] == {"x": 1}
    assert decode_reply(control.encode(control.event("ready", {"pid": 1})))["kind"] == "event"
    with pytest.raises(ControlError):
        decode_reply(line({"v": 1, "id": 1}))


def test_every_record_kind_the_stand_in_writes_is_documented():
    from pathlib import Path

    import hilconform.emulators.kubelet_stand_in as package

    source = "\n".join(p.read_text() for p in Path(package.__file__).parent.glob("*.py"))
    prefixes = ("allocate", "preferred_allocation", "prestart")
    written = {k for k in control.RECORD_KINDS if f'"{k}"' in source}
    written |= {f"{p}_{end}" for p in prefixes for end in ("request", "response", "error")}
    assert written == set(control.RECORD_KINDS)
