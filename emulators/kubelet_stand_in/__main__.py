"""`python3 -m hilconform.emulators.kubelet_stand_in --plugin-dir DIR [--control stdio|unix:PATH]`.

Serves kubelet.sock in DIR (default: the standard plugin directory) and the control
protocol on stdin/stdout (default) or on a unix socket; stdout carries protocol lines
only (the first is the ``ready`` event), logs go to stderr. Ends on the ``stop``
request, at end of standard input (stdio control), on SIGTERM or SIGINT; exit status 0,
or 2 when it cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from hilconform.runtime.deviceplugin.constants import DEVICE_PLUGIN_PATH

from . import control
from .control_server import POLL_S, Dispatcher, LineServer, UnixControlServer
from .device_manager import DEFAULT_DIAL_TIMEOUT_S, DEFAULT_MAX_MESSAGE_BYTES, KubeletStandIn
from .promptness import ABOVE_INTERRUPT_THREADS, run_promptly
from .records import RecordStore


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m hilconform.emulators.kubelet_stand_in", description=__doc__
    )
    parser.add_argument("--plugin-dir", default=DEVICE_PLUGIN_PATH, help="where kubelet.sock is served")
    parser.add_argument("--control", default="stdio", help="stdio (default) or unix:PATH")
    parser.add_argument(
        "--dial-timeout",
        type=float,
        default=DEFAULT_DIAL_TIMEOUT_S,
        help="seconds to reach a registering plugin's socket (the kubelet's 10)",
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=control.DEFAULT_CALL_TIMEOUT_S,
        help="default deadline of each call to a plugin, in seconds",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="larger gRPC messages are refused (gRPC's and the kubelet's 4 MiB)",
    )
    parser.add_argument(
        "--records-per-stream",
        type=int,
        default=1000,
        help="records kept per (resource, kind); older ones are dropped and counted",
    )
    parser.add_argument("--records-max-bytes", type=int, default=64 << 20, help="record JSON kept in all")
    parser.add_argument("--journal", metavar="PATH",
                        help="also append every record to PATH as a JSON line (at most --records-max-bytes)")
    parser.add_argument("--verbose", action="store_true", help="log every registration and stream end")
    parser.add_argument(
        "--realtime",
        type=int,
        metavar="PRIORITY",
        default=0,
        help=f"run as SCHED_FIFO PRIORITY (the harness asks {ABOVE_INTERRUPT_THREADS}: above the kernel's "
        "interrupt threads), so that a message is recorded when the plugin sent it; 0 (default): as started",
    )
    args = parser.parse_args(argv)
    if args.control != "stdio" and not args.control.startswith("unix:"):
        parser.error("--control is stdio or unix:PATH")
    return args


def _answers(path: str) -> bool:
    """Whether a live server accepts connections on the unix socket `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scheduling = run_promptly(args.realtime)  # first: every thread started later inherits it
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="kubelet-stand-in: %(message)s",
    )
    if args.control.startswith("unix:") and _answers(args.control[len("unix:"):]):
        # A second start (the node's own and a harness's) must not take the first one's kubelet.sock,
        # journal or control socket: it leaves them as they are.
        print(f"kubelet-stand-in: another stand-in already answers on {args.control}: not started",
              file=sys.stderr)
        return 2
    try:
        records = RecordStore(per_stream=args.records_per_stream, max_bytes=args.records_max_bytes,
                              journal=args.journal, journal_max_bytes=args.records_max_bytes)
    except OSError as exc:
        print(f"kubelet-stand-in: cannot write the journal {args.journal}: {exc}", file=sys.stderr)
        return 2
    stand_in = KubeletStandIn(
        args.plugin_dir,
        records,
        dial_timeout_s=args.dial_timeout,
        call_timeout_s=args.call_timeout,
        max_message_bytes=args.max_message_bytes,
    )
    try:
        started = stand_in.start()
    except OSError as exc:
        print(f"kubelet-stand-in: cannot start in {args.plugin_dir}: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    dispatcher = Dispatcher(stand_in)
    stdout = sys.stdout.buffer
    ready = {**started, "pid": os.getpid(), "control": args.control, "scheduling": scheduling}
    unix_server = None
    if args.control == "stdio":
        server = LineServer(sys.stdin.buffer, stdout, dispatcher, stopping.set, stopping)
        server.send(control.event("ready", ready))

        def serve_then_stop():
            server.serve()
            stopping.set()  # the host closed our input: nobody is left to ask

        threading.Thread(target=serve_then_stop, name="control", daemon=True).start()
    else:
        unix_server = UnixControlServer(args.control[len("unix:") :], dispatcher, stopping.set, stopping)
        try:
            unix_server.start()
        except OSError as exc:
            stand_in.stop(f"control socket failed: {exc}")
            print(f"kubelet-stand-in: cannot listen on {args.control}: {exc}", file=sys.stderr)
            return 2
        stdout.write(control.encode(control.event("ready", ready)))
        stdout.flush()
    while not stopping.wait(POLL_S):
        pass
    stand_in.stop("stand-in stopped")
    if unix_server is not None:
        unix_server.close()
    records.close()
    return 0


def run() -> None:
    """main(), then leave at once: the control reader may sit in a blocking read of stdin,
    which the interpreter's own shutdown would trip over (all output is flushed first)."""
    status = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


if __name__ == "__main__":
    run()
