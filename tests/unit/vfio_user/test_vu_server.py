"""A model server driven over a real unix socket by the small client: protocol, faults, supervision."""

import errno
import mmap
import os
import socket
import time

import pytest

from hilconform.emulators.errors import InfrastructureError, WaitTimeout
from hilconform.emulators.vfio_user import protocol as p
from hilconform.emulators.vfio_user.client import ClientError, VfioUserClient
from hilconform.emulators.vfio_user.device import ModelDevice
from hilconform.emulators.vfio_user.host import ModelHost
from hilconform.emulators.vfio_user.model import load_model
from hilconform.emulators.vfio_user.registers import register_map
from hilconform.emulators.vfio_user.server import ModelServer, SocketInUse

R = register_map()


@pytest.fixture
def served(tmp_path):
    server = ModelServer(ModelDevice(load_model("a100-sxm4"), "gpu0"), tmp_path / "gpu0.sock").start()
    client = VfioUserClient(server.socket_path, timeout_s=3)
    client.version()
    enable_memory(client)
    yield server, client
    client.close()
    server.stop()


def enable_memory(client):
    """What the guest does before touching a BAR: Memory Space on in the command register."""
    client.write(p.CONFIG_REGION, 0x04, b"\x02\x00")


def test_handshake_device_and_region_info(served):
    _server, client = served
    flags, regions, irqs = client.device_info()
    assert flags & p.DEVICE_FLAGS_PCI and flags & p.DEVICE_FLAGS_RESET
    assert (regions, irqs) == (p.NUM_REGIONS, p.NUM_IRQS)
    assert client.region_info(p.CONFIG_REGION)[:2] == (p.REGION_FLAG_READ | p.REGION_FLAG_WRITE, 4096)
    flags0, size0, fd0 = client.region_info(0)
    assert size0 == 16 << 20 and not flags0 & p.REGION_FLAG_MMAP and fd0 is None
    assert client.region_info(2)[1] == 0  # the upper half of 64-bit BAR1
    assert client.region_info(p.ROM_REGION)[1] == 0


def test_memfd_bar_is_shared_with_the_client(served):
    server, client = served
    flags, size, fd = client.region_info(1)
    assert flags & p.REGION_FLAG_MMAP and size == 256 << 20 and fd is not None
    try:
        with mmap.mmap(fd, 4096) as window:
            window[0:4] = b"abcd"
        assert client.read(1, 0, 4) == b"abcd"  # the server sees what the mapping wrote
    finally:
        os.close(fd)
    assert server.device.stats.region_reads >= 1


def test_config_and_register_reads(served):
    _server, client = served
    assert client.read(p.CONFIG_REGION, 0, 4) == bytes.fromhex("de10b020")
    assert client.read32(0, R["magic"]) == R["magic_value"]
    assert client.read32(0, R["ident"]) == 0x20B010DE


def test_posted_write_is_not_answered(served):
    _server, client = served
    client.write32(0, R["scratch"], 0x1234, posted=True)
    # If the server had answered the posted write, this read would receive the wrong reply id.
    assert client.read32(0, R["scratch"]) == 0x1234


def test_bad_access_gets_an_error_reply_and_the_connection_survives(served):
    _server, client = served
    with pytest.raises(ClientError) as err:
        client.read(0, (16 << 20) - 2, 4)
    assert err.value.errno == errno.EINVAL
    assert client.read32(0, R["magic"]) == R["magic_value"]


def test_stuck_queue_then_device_reset_clears_it(served):
    server, client = served
    server.device.stick_queue()
    client.write32(0, R["queue_doorbell"], 5)
    time.sleep(0.01)
    assert client.read32(0, R["queue_in_flight"]) == 5
    assert client.read32(0, R["magic"]) == R["magic_value"]
    client.reset()
    enable_memory(client)  # a reset clears the command register too
    assert client.read32(0, R["queue_in_flight"]) == 0
    assert server.device.stats.device_resets == 1


def test_flr_through_config_clears_queue_and_scratch(served):
    server, client = served
    server.device.stick_queue()
    client.write32(0, R["queue_doorbell"], 3)
    client.write32(0, R["scratch"], 7)
    pcie = load_model("a100-sxm4").capability("pcie").offset
    devctl = int.from_bytes(client.read(p.CONFIG_REGION, pcie + 8, 2), "little")
    client.write(p.CONFIG_REGION, pcie + 8, (devctl | 0x8000).to_bytes(2, "little"))
    assert client.read32(0, R["magic"]) == 0xFFFFFFFF  # FLR: memory decoding off again
    enable_memory(client)
    assert client.read32(0, R["queue_in_flight"]) == 0 and client.read32(0, R["scratch"]) == 0
    assert server.device.stats.flrs == 1


def test_fell_off_the_bus_reads_all_ones(served):
    server, client = served
    server.device.fall_off_bus()
    assert client.read(p.CONFIG_REGION, 0, 4) == b"\xff" * 4
    assert client.read32(0, R["magic"]) == 0xFFFFFFFF
    server.device.fall_off_bus(False)
    assert client.read32(0, R["magic"]) == R["magic_value"]


def test_firmware_mismatch_link_and_config_loss(served):
    server, client = served
    server.device.set_firmware_version("91.0.1")
    assert client.read32(0, R["firmware_version"]) == 91 << 16 | 1
    server.device.train_link("8", 8)
    pcie = load_model("a100-sxm4").capability("pcie").offset
    lnksta = int.from_bytes(client.read(p.CONFIG_REGION, pcie + 0x12, 2), "little")
    assert (lnksta & 0xF, (lnksta >> 4) & 0x3F) == (3, 8)
    client.write(p.CONFIG_REGION, 0x10, (0xFD000000).to_bytes(4, "little"))
    server.device.lose_config()
    assert client.read(p.CONFIG_REGION, 0x10, 4) == b"\0\0\0\0"
    assert client.read32(0, R["magic"]) == 0xFFFFFFFF  # memory decoding was lost with it
    enable_memory(client)
    assert client.read32(0, R["magic"]) == R["magic_value"]


def test_dead_server_closes_the_connection(served):
    server, client = served
    server.die()
    with pytest.raises((p.PeerClosed, OSError)):
        client.read32(0, R["magic"])
    assert server.health(1.0) == "dead"
    assert server.socket_path.exists()  # like a killed server, it leaves its socket file


def test_a_second_server_on_a_live_socket_is_refused(served, tmp_path):
    server, _client = served
    other = ModelServer(ModelDevice(load_model("t4"), "other"), server.socket_path)
    with pytest.raises(SocketInUse, match="already listening"):
        other.start()
    other.device.close()
    assert server.health(1.0) == "ok"


def test_stale_socket_is_reclaimed_and_non_sockets_are_not_touched(tmp_path):
    stale = tmp_path / "stale.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(stale))
    sock.close()  # a socket file nobody listens on
    server = ModelServer(ModelDevice(load_model("t4"), "t"), stale).start()
    server.stop()
    plain = tmp_path / "plain.sock"
    plain.write_text("not a socket")
    with pytest.raises(SocketInUse, match="not a socket"):
        ModelServer(ModelDevice(load_model("t4"), "t"), plain).start()
    assert plain.read_text() == "not a socket"


def test_supervisor_notices_dead_and_hung_servers(tmp_path):
    host = ModelHost(hung_after_s=0.3)
    removed = []
    try:
        dead = host.serve("gpu0", "a100-sxm4", tmp_path / "a.sock")
        hung = host.serve("gpu1", "a100-sxm4", tmp_path / "b.sock")
        host.supervisor.set_policy("gpu1", "remove", remover=removed.append)
        with pytest.raises(WaitTimeout):
            host.supervisor.wait_incident("gpu0", timeout_s=0.3)
        dead.die()
        incident = host.supervisor.wait_incident("gpu0", timeout_s=2)
        assert (incident.kind, incident.action) == ("dead", "left")
        client = VfioUserClient(hung.socket_path, timeout_s=0.2)
        client.version()
        hung.hang()
        with pytest.raises(TimeoutError):
            client.read32(0, R["magic"])
        incident = host.supervisor.wait_incident("gpu1", timeout_s=3)
        assert (incident.kind, incident.action) == ("hung", "removed") and removed == ["gpu1"]
        assert 0.3 <= incident.noticed_s - incident.stalled_since_s < 1.0
        client.close()
    finally:
        host.stop()


def test_a_socket_path_that_cannot_be_bound_is_an_infrastructure_error(tmp_path):
    too_long = tmp_path / ("x" * 120 + ".sock")  # unix socket paths stop at 108 bytes
    device = ModelDevice(load_model("t4"), "t")
    with pytest.raises(InfrastructureError, match="cannot listen on"):
        ModelServer(device, too_long).start()
    device.close()
