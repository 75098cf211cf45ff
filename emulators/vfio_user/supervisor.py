"""Notice a dead or hung model server and do what the test asked.

QEMU reports nothing when a vfio-user server dies or hangs (no QMP event, no
hot-plug event; the guest reads all ones or stalls), so somebody has to look.
The supervisor polls each server's health. Per device the test chooses the
policy: "leave" (the device stays fallen off the bus, the incident is
recorded) or "remove" (the supervisor calls the remover it was given, e.g. a
QMP device_del). Every incident is recorded once, with when it was noticed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import WaitTimeout

POLICIES = ("leave", "remove")


@dataclass(frozen=True)
class Incident:
    name: str
    kind: str  # dead | hung
    noticed_s: float  # time.monotonic() when noticed
    action: str  # left | removed | remove failed: <why>
    stalled_since_s: float | None = None  # hung: when the unanswered request arrived (monotonic)


@dataclass
class _Watched:
    server: object
    policy: str
    remover: Callable[[str], None] | None
    reported: bool = False


class Supervisor:
    def __init__(self, hung_after_s: float = 1.0, poll_s: float = 0.05):
        self.hung_after_s = hung_after_s
        self.poll_s = poll_s
        self.incidents: list[Incident] = []
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, server, policy: str = "leave",
              remover: Callable[[str], None] | None = None) -> None:
        self._check_policy(policy, remover)
        with self._lock:
            self._watched[name] = _Watched(server, policy, remover)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vfio-user-supervisor", daemon=True)
            self._thread.start()

    def unwatch(self, name: str) -> None:
        with self._lock:
            self._watched.pop(name, None)

    def set_policy(self, name: str, policy: str, remover: Callable[[str], None] | None = None) -> None:
        with self._lock:
            if name not in self._watched:
                watched_names = ", ".join(self._watched)
                raise KeyError(f"supervisor: no server {name!r} is watched (watched: {watched_names})")
            watched = self._watched[name]
            self._check_policy(policy, remover or watched.remover)
            watched.policy = policy
            watched.remover = remover or watched.remover

    @staticmethod
    def _check_policy(policy: str, remover) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown supervisor policy {policy!r} (use one of {POLICIES})")
        if policy == "remove" and remover is None:
            raise ValueError("policy 'remove' needs a remover")

    def wait_incident(self, name: str, timeout_s: float) -> Incident:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                found = next((i for i in self.incidents if i.name == name), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(f"supervisor: no incident for {name!r} within {timeout_s} s")
                self._lock.wait(min(left, 0.1))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                items = list(self._watched.items())
            for name, watched in items:
                if watched.reported:
                    continue
                health = watched.server.health(self.hung_after_s)
                if health in ("dead", "hung"):
                    watched.reported = True
                    self._act(name, health, watched)

    def _act(self, name: str, kind: str, watched: _Watched) -> None:
        noticed = time.monotonic()
        since = getattr(watched.server, "busy_since", None) if kind == "hung" else None
        action = "left"
        if watched.policy == "remove":
            try:
                watched.remover(name)
                action = "removed"
            except Exception as exc:  # noqa: BLE001 - recorded for the test to see
                action = f"remove failed: {exc}"
        with self._lock:
            self.incidents.append(Incident(name, kind, noticed, action, since))
            self._lock.notify_all()
