"""Mutant dp_no_reregistration, breaks DP-08: the plugin registers once and never again.

Plausible bug (the classic one): the plugin does not watch its socket; when the kubelet restarts
and deletes the plugin sockets, the plugin keeps serving a socket nobody can reach and the node's
devices vanish from the scheduler until the plugin is restarted.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    def register_loop_once(self) -> None:
        for endpoint in self.endpoints:
            while not self._stop.is_set() and not endpoint.registered:
                try:
                    if endpoint.server is None:
                        endpoint.serve()
                    endpoint.register()
                except (OSError, TimeoutError, front_end.grpc.RpcError):
                    self._stop.wait(front_end.RETRY_S)

    front_end.DevicePluginFrontEnd._register_loop = register_loop_once


if __name__ == "__main__":
    launch("dp_no_reregistration", apply)
