"""The protocol module and the service's line handler under fuzzing.

Rule checked: every non-empty line gets exactly one reply or error (never an
exception, never silence), and replies are well-formed for the host side.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_service import Client, Harness

from hilconform.runtime import protocol
from hilconform.runtime.protocol import ProtocolError, decode_request

# methods that would stop the runtime or start procedures are fuzzed separately
SAFE_METHODS = sorted(set(protocol.METHODS) - {"shutdown"})


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"not json", protocol.PARSE_ERROR),
        (b"\xff\xfe", protocol.PARSE_ERROR),
        (b"[1,2]", protocol.PARSE_ERROR),
        (b'{"v":1,"id":1,"method":"hello","params":NaN}', protocol.PARSE_ERROR),
        (b'{"v":1,"method":"hello"}', protocol.INVALID_REQUEST),
        (b'{"v":1,"id":true,"method":"hello"}', protocol.INVALID_REQUEST),
        (b'{"v":1,"id":1.5,"method":"hello"}', protocol.INVALID_REQUEST),
        (b'{"id":1,"method":"hello"}', protocol.INVALID_REQUEST),
        (b'{"v":2,"id":1,"method":"hello"}', protocol.UNSUPPORTED_VERSION),
        (b'{"v":1,"id":1,"method":"fly"}', protocol.UNKNOWN_METHOD),
        (b'{"v":1,"id":1,"method":"hello","extra":1}', protocol.INVALID_REQUEST),
        (b'{"v":1,"id":1,"method":"device","params":{}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"device","params":{"device":7}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"allocate","params":{"count":true}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"renew","params":{"lease":"L1","ttl_s":1e999}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"hello","params":[]}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"hello","params":{"bogus":1}}', protocol.INVALID_PARAMS),
        (b"[" * 100_000, protocol.LINE_TOO_LONG),
        # numbers: in range before any use (an integer of 10**309 has no float)
        (
            b'{"v":1,"id":1,"method":"renew","params":{"lease":"L1","ttl_s":1' + b"0" * 309 + b"}}",
            protocol.INVALID_PARAMS,
        ),
        (
            b'{"v":1,"id":1,"method":"allocate","params":{"class":"x","ttl_s":86400.5}}',
            protocol.INVALID_PARAMS,
        ),
        (b'{"v":1,"id":1,"method":"allocate","params":{"class":"x","ttl_s":0}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"allocate","params":{"class":"x","ttl_s":false}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"allocate","params":{"class":"x","count":1025}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"allocate","params":{"class":"x","count":0}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"subscribe","params":{"since_seq":-1}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"hello","params":{"versions":[1.0]}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"hello","params":{"versions":[true]}}', protocol.INVALID_PARAMS),
        (b'{"v":1,"id":1,"method":"hello","params":{"versions":[0]}}', protocol.INVALID_PARAMS),
        (
            b'{"v":1,"id":1,"method":"hello","params":{"versions":' + b"[1" + b",1" * 64 + b"]}}",
            protocol.INVALID_PARAMS,
        ),
        (b'{"v":1,"id":1,"method":"renew","params":{"lease":"L1","ttl_s":-Infinity}}', protocol.PARSE_ERROR),
    ],
)
def test_decode_refusals(line, code):
    with pytest.raises(ProtocolError) as err:
        decode_request(line)
    assert err.value.code == code


@pytest.mark.parametrize(
    "params",
    [
        {"class": "x", "ttl_s": 86400},
        {"class": "x", "ttl_s": 1e-9},
        {"class": "x", "count": 1024},
        {"class": "x", "count": 1},
    ],
)
def test_numbers_at_their_bounds_are_accepted(params):
    assert decode_request(protocol.encode(protocol.request(1, "allocate", params))).params == params


def test_decode_keeps_the_id_when_it_can():
    with pytest.raises(ProtocolError) as err:
        decode_request(b'{"v":1,"id":"abc","method":"fly"}')
    assert err.value.req_id == "abc"


def test_round_trip_and_host_side_validation():
    req = decode_request(protocol.encode(protocol.request(3, "allocate", {"class": "nvme", "count": 2})))
    assert (req.id, req.method, req.params) == (3, "allocate", {"class": "nvme", "count": 2})
    assert protocol.decode_message(protocol.encode(protocol.reply(3, {"a": 1})))["kind"] == "reply"
    assert protocol.decode_message(protocol.encode(protocol.error(None, "X", "m")))["kind"] == "error"
    ev = protocol.event("dropped", 4, 10, {"count": 2})
    assert protocol.decode_message(protocol.encode(ev))["kind"] == "event"
    with pytest.raises(ProtocolError):
        protocol.decode_message(protocol.encode(protocol.event("dropped", 4, 10, {})))
    with pytest.raises(ProtocolError):
        protocol.decode_message(b'{"v":1,"id":1,"result":1,"error":{}}')


def test_encode_is_one_ascii_line():
    data = protocol.encode(protocol.reply("é\n", {"s": "ünï\ncode"}))
    assert data.endswith(b"\n") and data.count(b"\n") == 1 and data.isascii()


# --- fuzzing the service's line handler ---------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory):
    h = Harness(tmp_path_factory.mktemp("fuzz"))
    h.add_nvme()
    h.start()
    client = Client(h.svc, subscribe=False)
    yield client
    h.stop()


def _replies_to(client: Client, line: bytes) -> tuple[list[dict], int]:
    before = len(client.pump())
    client.send_line(line)
    new = client.pump()[before:]
    return [m for m in new if m["kind"] != "event"], before


def _assert_one_answer(client: Client, line: bytes) -> None:
    if not line.strip():
        return  # documented: blank lines are ignored by the transport (never reach the handler)
    out, before = _replies_to(client, line)
    deferred = False
    try:
        req = json.loads(line)
        deferred = isinstance(req, dict) and req.get("method") in (
            "remove",
            "reset",
            "recover",
            "health_poll",
        )
    except ValueError:
        pass
    if deferred and not out:  # answered later from a worker thread: wait, so it is not counted later
        req_id = req.get("id")
        client.wait(
            lambda m: m["kind"] != "event" and m.get("id") == req_id,
            what=f"deferred reply {line!r}",
            seen=before,  # ids repeat across examples: only a reply to this line counts
        )
        return
    assert len(out) == 1, (line, out)
    assert ("result" in out[0]) != ("error" in out[0])
    if "error" in out[0]:
        assert out[0]["error"]["code"] in protocol.ERROR_CODES


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_never_break_the_handler(fuzz_client, data):
    _assert_one_answer(fuzz_client, data.replace(b"\n", b" "))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(st.dictionaries(st.sampled_from(["v", "id", "method", "params", "x"]), json_values, max_size=5))
def test_random_json_objects_get_one_answer(fuzz_client, obj):
    _assert_one_answer(fuzz_client, json.dumps(obj).encode())


@FUZZ
@given(
    method=st.sampled_from(SAFE_METHODS),
    params=st.dictionaries(
        st.sampled_from(
            [
                "device",
                "class",
                "count",
                "lease",
                "ttl_s",
                "holder",
                "events",
                "since_seq",
                "force",
                "versions",
                "bogus",
            ]
        ),
        json_values,
        max_size=4,
    ),
    req_id=st.integers(-(2**70), 2**70) | st.text(max_size=10),
)
def test_well_framed_requests_with_random_params(fuzz_client, method, params, req_id):
    line = json.dumps({"v": 1, "id": req_id, "method": method, "params": params}).encode()
    _assert_one_answer(fuzz_client, line)
    fuzz_client.svc.leases.check_invariants()


def test_the_runtime_still_answers_after_the_fuzzing(fuzz_client):
    assert fuzz_client.ok("hello")["protocol"] == 1
    assert fuzz_client.svc.stats_counts["internal_errors"] == 0


def test_docs_protocol_md_describes_every_method_event_and_error():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
    for name in list(protocol.METHODS) + list(protocol.EVENTS) + list(protocol.ERROR_CODES):
        assert f"`{name}`" in doc, f"docs/protocol.md does not mention `{name}`"


def test_subscribe_with_ill_typed_event_names(fuzz_client):
    reply = fuzz_client.call("subscribe", {"events": [["x"], {"a": 1}]})
    assert reply["error"]["code"] == protocol.INVALID_PARAMS
