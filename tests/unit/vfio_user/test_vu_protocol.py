"""The wire format: framing over a socketpair, fds with the header, version payloads."""

import os
import socket
import struct

import pytest

from hilconform.emulators.vfio_user import protocol as p


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_message_round_trip_with_an_fd(pair):
    a, b = pair
    read_end, write_end = os.pipe()
    try:
        p.send(a, p.encode(7, p.DMA_MAP, b"x" * 32, p.TYPE_REQUEST | p.NO_REPLY), [write_end])
        msg = p.receive(b)
        assert (msg.msg_id, msg.command, msg.payload, msg.wants_reply) == (7, p.DMA_MAP, b"x" * 32, False)
        assert len(msg.fds) == 1
        os.write(msg.fds[0], b"!")
        assert os.read(read_end, 1) == b"!"  # the fd that arrived is the pipe we sent
        os.close(msg.fds[0])
    finally:
        os.close(read_end)
        os.close(write_end)


def test_header_size_counts_the_header(pair):
    a, b = pair
    raw = p.encode(1, p.REGION_READ, b"12345678")
    assert struct.unpack_from("<HHI", raw) == (1, p.REGION_READ, 16 + 8)
    a.sendall(raw[:5])
    a.sendall(raw[5:])  # split across sends: still one message
    assert p.receive(b).payload == b"12345678"


def test_impossible_size_is_a_protocol_error(pair):
    a, b = pair
    a.sendall(p.HEADER.pack(1, p.VERSION, 8, 0, 0))  # smaller than the header itself
    with pytest.raises(p.MalformedMessage, match="impossible size"):
        p.receive(b)


def test_peer_closing_is_reported(pair):
    a, b = pair
    a.close()
    with pytest.raises(p.PeerClosed):
        p.receive(b)


def test_version_payload_is_nul_terminated_json():
    payload = p.version_payload({"max_msg_fds": 8})
    assert payload[:4] == struct.pack("<HH", 0, 0) and payload.endswith(b"\0")
    assert p.parse_version(payload) == (0, 0, {"capabilities": {"max_msg_fds": 8}})
    with pytest.raises(p.MalformedMessage):
        p.parse_version(b"\0\0\0\0{not json")
