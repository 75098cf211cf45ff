"""The model devices of one emulated host: one server per slot, all in this process.

The VM starts them before QEMU (QEMU connects while realizing the device) and
stops them after QEMU has quit. Tests reach a slot's device (fault knobs) and
server (die, hang) through here; the supervisor watches every server.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from .device import ModelDevice
from .model import load_model
from .server import ModelServer
from .supervisor import Supervisor


class ModelHost:
    def __init__(self, hung_after_s: float = 1.0):
        self.servers: dict[str, ModelServer] = {}
        self.supervisor = Supervisor(hung_after_s=hung_after_s)

    def serve(self, slot: str, model_name: str, socket_path: Path,
              device_id: str | None = None, serial_number: int | None = None,
              state: dict | None = None) -> ModelServer:
        """Start serving `model_name` for `slot` on `socket_path` (watched, policy 'leave').

        `serial_number` (the DSN) names the unit; by default the slot's own unit: the same
        number each time the slot is served, as when a card is pulled and put back. `state`:
        a saved card's (`saved_states`), for a VM restored from a saved one."""
        if slot in self.servers:
            raise ValueError(f"slot {slot!r} already has a model server (release it first)")
        model = load_model(model_name)
        if serial_number is None:  # each slot's unit its own DSN, as two real cards have
            serial_number = model.serial_number + (zlib.crc32(slot.encode()) & 0xFFFF)
        if not 0 <= serial_number < 1 << 64:
            raise ValueError(f"serial number {serial_number:#x} does not fit the DSN's 64 bits")
        device = ModelDevice(model, device_id or slot, serial_number)
        server = ModelServer(device, socket_path)
        try:
            if state is not None:
                device.load_state(state)
            server.start()
        except BaseException:
            device.close()
            raise
        self.servers[slot] = server
        self.supervisor.watch(device.instance, server)
        return server

    def thread_ids(self) -> list[int]:
        """The native thread IDs of the servers' threads that answer QEMU."""
        return [tid for server in list(self.servers.values()) if (tid := server.thread_id()) is not None]

    def saved_states(self) -> dict[str, dict]:
        """Each served slot's card state (ModelDevice.saved_state), for a saved VM."""
        return {slot: server.device.saved_state() for slot, server in self.servers.items()}

    def device(self, slot: str) -> ModelDevice:
        return self.server(slot).device

    def server(self, slot: str) -> ModelServer:
        try:
            return self.servers[slot]
        except KeyError:
            raise KeyError(f"no model served for slot {slot!r} (served: {', '.join(self.servers)})") from None

    def supervise(self, device_id: str, policy: str, qmp=None) -> None:
        """What the supervisor does when this device's server dies or hangs.

        "leave": the device stays, fallen off the bus. "remove": QMP device_del through `qmp`
        (the VM's session), as an operator would after noticing a dead card.
        """
        remover = None
        if policy == "remove":
            if qmp is None:
                raise ValueError("policy 'remove' needs the VM's QMP session")
            remover = lambda dev: qmp.execute("device_del", {"id": dev})  # noqa: E731
        self.supervisor.set_policy(device_id, policy, remover)

    def release(self, slot: str) -> None:
        """Stop serving a slot (after its device was removed); a later serve() starts afresh."""
        server = self.servers.pop(slot, None)
        if server is not None:
            self.supervisor.unwatch(server.device.instance)
            server.stop()

    def resume_all(self) -> None:
        """Let hung servers answer again (QEMU's quit would otherwise wait on them)."""
        for server in self.servers.values():
            server.resume()

    def stop(self) -> None:
        self.supervisor.stop()
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
