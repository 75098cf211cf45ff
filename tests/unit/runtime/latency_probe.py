"""``python latency_probe.py SOCKET``: ``inventory`` every 20 ms until stdin closes; prints the latencies.

Why a process of its own: a probe thread in the process that runs 50 fuzz
clients would measure its own wait for the GIL, not the runtime.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from line_client import LineClient

EVERY_S = 0.02


def main(path: str) -> int:
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    samples, failures = [], []
    with LineClient(path, timeout=20.0) as client:
        while not stop.is_set():
            t0 = time.monotonic_ns()
            try:
                reply = client.call("inventory")
            except OSError as exc:
                failures.append(repr(exc))
                break
            samples.append((time.monotonic_ns() - t0) / 1e9)
            if "result" not in reply:
                failures.append(str(reply)[:200])
            stop.wait(EVERY_S)
    print(json.dumps({"samples": samples, "failures": failures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
