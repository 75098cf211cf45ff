"""`python3 -m hilconform.emulators.kubelet_stand_in.ask PATH 'REQUEST'`: one control request.

Why: the host reaches the node through commands (the guest agent, an SSH session), not a
socket of its own; this connects to the stand-in's unix control socket, sends one request
line, prints its reply line, and exits (0 on any reply, 2 when the stand-in cannot be reached).
"""

from __future__ import annotations

import json
import socket
import sys

from . import control

TIMEOUT_S = 120.0


def ask(path: str, request: dict, timeout_s: float = TIMEOUT_S) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(control.encode(request))
        reader = sock.makefile("rb")
        while True:
            line = reader.readline(control.MAX_LINE_BYTES * 64)
            if not line:
                raise ConnectionError(f"the stand-in at {path} closed the stream before answering")
            reply = json.loads(line)
            if reply.get("id") == request.get("id") and "event" not in reply:
                return reply


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    try:
        reply = ask(argv[0], json.loads(argv[1]))
    except (OSError, ConnectionError, ValueError) as exc:
        print(f"kubelet-stand-in ask: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
