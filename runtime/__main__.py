"""``python3 -m hilconform.runtime --config FILE.toml``: run the reference device runtime.

Exit status: 0 after a shutdown request or SIGTERM/SIGINT, 2 for a bad
config (the message names the file and the key), 1 when it cannot start.
SIGUSR1 writes every thread's stack to stderr (the log) and carries on: how a
test bed that saw the runtime stop answering learns where it was stuck. A fatal
signal (SIGBUS from a BAR mapping revoked under a read, SIGSEGV) writes them too.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys

from .config import ConfigError, load
from .own_resources import OwnResourcesShort

GIL_SWITCH_INTERVAL_S = 0.001


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hilconform.runtime", description=__doc__)
    parser.add_argument("--config", help="runtime TOML (keys: runtime/default-config.toml)")
    parser.add_argument("--check-config", action="store_true", help="validate the config and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s hilconform-runtime %(levelname)s %(message)s",
    )
    try:
        cfg = load(args.config)
    except ConfigError as exc:
        print(f"hilconform-runtime: config error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"hilconform-runtime: {cfg.path}: ok")
        return 0
    # Hand the GIL over every 1 ms, not 5: the I/O thread answers clients while request
    # workers run health polls, and each handover it waits for delays every reply.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a fatal signal (SIGBUS, SIGSEGV) says where

    from .service import Service  # after the config: a config error needs no pyudev

    try:
        service = Service(cfg)
        service.start()
    except (OSError, ValueError, ImportError, OwnResourcesShort) as exc:
        print(f"hilconform-runtime: cannot start: {exc}", file=sys.stderr)
        return 1
    # The handler only notes the signal: it runs in this thread, possibly inside service.wait(),
    # which holds the stop event's lock, and request_stop() setting that event from there
    # deadlocked (seen once in ~40 restarts: the runtime never stopped on SIGTERM). The loop below
    # acts on it within a second.
    stop_signals: list[str] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda n, _f: stop_signals.append(signal.Signals(n).name))
    while not service.wait(1.0):
        if stop_signals:
            service.request_stop(stop_signals[0])
    service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
