"""The emulated guest as a stand-in real host: sshd on a loopback port, an ephemeral key.

CI has no accelerator, so the real-host backend is pointed at the emulated guest:
to it the guest is a real Linux host (its sysfs, its kernel, its udev), reached
over SSH through a loopback port forward. The guest runs no runtime of its own
(the real-host backend deploys one), and the key pair lives only for the run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hilconform.emulators.errors import InfrastructureError
from hilconform.emulators.profile import load_profile
from hilconform.emulators.vm import EmulatedVM

SSH_READY_S = 60.0
ROOT = Path(__file__).resolve().parent.parent.parent
RUN_TIMEOUT_S = 900
STATE_TIMEOUT_S = 180  # lspci -vvv + a python3 start in a TCG guest on a loaded 2-core machine
# Read by the host's own tools, never by the project's code: what a read-only run must not change.
STATE_SCRIPT = r"""
lspci -D -vvv -nn
python3 - <<'PY'
import glob, os
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
for d in sorted(glob.glob("/sys/bus/pci/devices/*")):
    driver = os.path.basename(os.readlink(d + "/driver")) if os.path.islink(d + "/driver") else None
    attrs = [read(f"{d}/{a}") for a in ("enable", "power_state", "d3cold_allowed", "current_link_speed",
                                       "current_link_width", "broken_parity_status", "msi_bus")]
    print(os.path.basename(d), driver, *attrs)
for s in sorted(glob.glob("/sys/bus/pci/slots/*/power")):
    print(s, read(s))
PY
echo "modules: $(cut -d' ' -f1 /proc/modules | sort | tr '\n' ' ')"
echo "tmp: $(ls -a /tmp | tr '\n' ' ')"
echo "python processes: $(pgrep -c python3 || true)"
"""


@dataclass
class StandInHost:
    vm: EmulatedVM
    key: Path
    ssh_config: Path

    def awake(self) -> StandInHost:
        """The stand-in, running: the session's one is paused between the tests that use it
        (conftest.py), and every way in (ssh, target, ssh_port) wakes it first."""
        self.vm.resume()
        return self

    @property
    def ssh_port(self) -> int:
        return self.awake().vm.ssh_port

    @property
    def target(self) -> str:
        return f"real:ssh://root@127.0.0.1:{self.ssh_port}"

    def ssh(self, command: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-p", str(self.ssh_port),
                               "root@127.0.0.1", command], capture_output=True, text=True, timeout=timeout_s)


def make_key(folder: Path) -> Path:
    key = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hilconform-ci", "-f", str(key)],
                   check=True, capture_output=True)
    return key


def write_ssh_config(folder: Path, key: Path) -> Path:
    """An ssh_config for the stand-in: the run's key only, its host key not remembered."""
    config = folder / "ssh_config"
    config.write_text(
        "Host *\n"
        f"  IdentityFile {key}\n"
        "  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n"
        "  LogLevel ERROR\n"
    )
    return config


def start_stand_in(folder: Path, profile: str = "a100-stock") -> StandInHost:
    """Boot the guest with sshd (no runtime of its own) and wait until SSH logs in."""
    key = make_key(folder)
    config = write_ssh_config(folder, key)
    vm = EmulatedVM(load_profile(profile), runtime_config=None,
                    ssh_authorized_key=(folder / "id_ed25519.pub").read_text())
    vm.start()
    host = StandInHost(vm, key, config)
    deadline = time.monotonic() + SSH_READY_S
    last = ""
    while time.monotonic() < deadline:
        try:
            done = host.ssh("true", timeout_s=15)
        except subprocess.TimeoutExpired:
            continue
        if done.returncode == 0:
            return host
        last = done.stderr.strip()
        time.sleep(0.5)
    vm.stop()
    raise InfrastructureError(f"sshd in the stand-in guest did not accept the key within {SSH_READY_S:.0f}s: "
                              f"{last}")


def host_state(host: StandInHost) -> str:
    """The host's state as its own tools show it (what a read-only run must not change)."""
    done = host.ssh(STATE_SCRIPT, timeout_s=STATE_TIMEOUT_S)
    if done.returncode != 0:
        raise InfrastructureError(f"reading the stand-in's state failed: {done.stderr}")
    return done.stdout


def run_suites(host: StandInHost | None, *args: str, profile: str = "emulated-guest",
               target: str | None = None, ssh_config: Path | None = None) -> subprocess.CompletedProcess:
    """pytest in a subprocess against the stand-in (or `target`), as a lab run would be."""
    target = target or host.target
    ssh_config = ssh_config or host.ssh_config
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
            "--host", target, "--ssh-config", str(ssh_config), "--real-profile", profile, *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def outcome(done: subprocess.CompletedProcess) -> str:
    """The run's assertion lines first (the runtime log sections that follow them are long)."""
    errors = "\n".join(line for line in done.stdout.splitlines() if line.startswith("E  "))[:4000]
    return f"exit {done.returncode}\n{errors}\n...\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
