"""The reference runtime as a subprocess over a fake sysfs tree, and a line client for its socket.

Why a subprocess: abuse tests measure what belongs to the runtime alone (its
file-descriptor limit, CPU time, RSS, threads, log) while the test process
opens hundreds of connections; in-process, the two would share all of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from line_client import LineClient
from test_service import Harness

NVMES = ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0")
START_TIMEOUT_S = 20.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def build_tree(tmp_path: Path, nvmes: tuple[str, ...] = NVMES) -> Harness:
    """A fake sysfs tree with one healthy nvme per root port (built only: no service started)."""
    tree = Harness(tmp_path)
    for index, bdf in enumerate(nvmes):
        port = f"0000:00:{index + 2:02x}.0"
        tree.add_nvme(bdf=bdf, port=port, slot=str(index + 1), serial=f"SN{index + 1}")
    return tree


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class RuntimeProcess:
    """``python -m hilconform.runtime --config FILE`` over ``tree``, optionally with a low fd limit."""

    def __init__(self, tree: Harness, nofile: int | None = None, **config):
        self.sockdir = tempfile.mkdtemp(prefix="hcrt", dir="/tmp")
        self.path = f"{self.sockdir}/rt.sock"
        self.config = {
            "transport": f"unix:{self.path}",
            "sysfs_root": str(tree.fake.root),
            "kernel_log": "",
            "udev": False,
            "hot_add_step_timeout_ms": 300,
            "health_poll_ms": 200,
            **config,
        }
        self.nofile = nofile
        self.config_path = Path(self.sockdir) / "runtime.toml"
        self.log_path = Path(self.sockdir) / "runtime.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RuntimeProcess:
        self.config_path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in self.config.items()))
        # the limit is set by the child itself (no preexec_fn: the test process has threads)
        limit = (
            ""
            if self.nofile is None
            else f"resource.setrlimit(resource.RLIMIT_NOFILE, ({self.nofile}, {self.nofile}))\n"
        )
        launcher = (
            "import resource, runpy, sys\n"
            + limit
            + f"sys.argv = ['hilconform.runtime', '--config', {str(self.config_path)!r}]\n"
            "runpy.run_module('hilconform.runtime', run_name='__main__', alter_sys=True)\n"
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", launcher], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"runtime exited {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                with LineClient(self.path, timeout=2.0) as probe:
                    probe.ok("hello")
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"runtime not serving after {START_TIMEOUT_S}s") from None
                time.sleep(0.05)

    def wait_all_healthy(self, client: LineClient, bdfs=NVMES, timeout: float = START_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            devices = {d["device"]: d["state"] for d in client.ok("inventory")["devices"]}
            if all(devices.get(b) == "HEALTHY" for b in bdfs):
                return devices
            assert time.monotonic() < deadline, f"devices not HEALTHY after {timeout}s: {devices}"
            time.sleep(0.05)

    # --- what the process uses ---------------------------------------------------------
    def cpu_s(self) -> float:
        """utime + stime of the runtime process (all its threads), in seconds."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for name in ("runtime.toml", "runtime.log", "rt.sock"):
            try:
                os.unlink(Path(self.sockdir) / name)
            except OSError:
                pass
        try:
            os.rmdir(self.sockdir)
        except OSError:
            pass
