"""One emulated host: QEMU, its NBD queue backends, QMP session and guest agent.

Start: instance folder, NBD backends, QEMU paused (`-S`), one QMP session,
`cont`, then wait until the guest agent answers. Stop: QMP `quit`, then
SIGTERM, then SIGKILL; every child ends and the folder goes (unless kept).
Any VM still running when the interpreter exits (Ctrl-C) is stopped by an
atexit hook; if the process is killed outright, PR_SET_PDEATHSIG does it.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import socket
import subprocess
import time
import weakref
from pathlib import Path

from . import guest_clock, instance_dir, thread_wait, vm_snapshot
from .errors import InfrastructureError, QemuDied, QmpError
from .guest_agent import GuestAgent
from .image import GuestImage
from .layout import InstanceLayout
from .nbd_queue import NbdQueueBackend
from .processes import ChildProcess, wait_for_path
from .profile import HostProfile
from .qemu_command import build_argv, model_socket
from .qmp_session import QmpSession
from .toolchain import qemu_binary_for, qemu_version
from .vfio_user import guest_driver
from .vfio_user.host import ModelHost
from .vm_snapshot import SavedVM

_live_vms: weakref.WeakSet[EmulatedVM] = weakref.WeakSet()
GUEST_RUN_SHARE = "/opt/hilconform/run"  # where the guest sees (its copy of) the run share
GUEST_SHARE_MOUNT = "/run/hilconform/share"  # the run share itself, mounted read-only for large files
SHARE_TAG = "hilconform_run"  # the run share's 9p mount tag (qemu_command.py)
RUNTIME_MODULE_FILE = "runtime.module"  # in the run share: the runtime the guest starts (none: the reference)
NODE_SERVICES_FILE = "node-services.sh"  # in the run share: what the guest's init starts before the runtime
# After QMP fails at start: how long QEMU may take to exit before the QMP error is all we say.
QEMU_EXIT_GRACE_S = 3.0


@atexit.register
def _stop_all() -> None:
    for vm in list(_live_vms):
        vm.stop()


class EmulatedVM:
    def __init__(
        self,
        profile: HostProfile,
        image: GuestImage | None = None,
        accel: str = "tcg",
        keep: bool = False,
        runtime_config: str | None = None,
        runtime_module: str | None = None,
        allow_reboot: bool = False,
        ssh_authorized_key: str | None = None,
        node_services: str | None = None,
    ):
        self.profile = profile
        self.image = image or GuestImage.locate()
        self.accel = accel
        self.keep = keep
        self.runtime_config = runtime_config
        self.runtime_module = runtime_module
        # QEMU always starts with -no-reboot (a reboot ends it: a kernel panic during the boot
        # does not loop until the ready deadline, and the VM's configuration key, hence its
        # saved VM, is the same with or without reboots). With allow_reboot, once the guest is
        # ready, QMP `set-action reboot=reset` makes a guest reboot (or QMP system_reset)
        # restart the guest instead.
        self.allow_reboot = allow_reboot
        # Opt-in sshd in the guest (a stand-in real host): the key it authorises for root,
        # and the loopback port that reaches its port 22 (chosen at start).
        self.ssh_authorized_key = ssh_authorized_key
        self.ssh_port: int | None = None
        # Shell commands the guest's init runs before it starts the runtime (the kubelet stand-in
        # of a host started for the device-plugin suites): part of the VM's configuration.
        self.node_services = node_services
        # One QEMU >= 10.1 for every host where it is set up (toolchain.qemu_binary_for).
        self.qemu_binary = qemu_binary_for(profile)
        self.qemu_version = qemu_version(self.qemu_binary)
        self.layout: InstanceLayout | None = None
        self.qemu: ChildProcess | None = None
        self.qmp: QmpSession | None = None
        self.agent: GuestAgent | None = None
        self.queues: dict[str, NbdQueueBackend] = {}
        self.models = ModelHost()  # vfio-user servers of the slots that hold device models
        self.timings: dict[str, float] = {}
        self.made_by: str | None = None  # "boot", or "restore" (from a saved VM) once started
        self.paused = False  # held still between its users (pause/resume)
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, ready_timeout_s: float | None = None, restore: SavedVM | None = None) -> EmulatedVM:
        """Boot the VM, or, with `restore`, load a saved ready VM of the same configuration
        (emulators/vm_snapshot.py): no boot, the guest and its runtime go on from the save."""
        ready_timeout_s = ready_timeout_s or self.profile.budgets.get("guest_ready_s", 90.0)
        started = time.monotonic()
        self.layout = InstanceLayout(instance_dir.make_instance_dir(self.profile.name))
        _live_vms.add(self)
        try:
            self._write_guest_share()
            for slot in self.profile.slots:
                if slot.populated and self.profile.kind(slot.device).queue == "nbd":
                    self.queue_backend(slot.name)
                if slot.populated and self.profile.kind(slot.device).model:
                    self.models.serve(slot.name, self.profile.kind(slot.device).model,
                                      model_socket(self.layout, slot.name),
                                      state=restore.card_states[slot.name] if restore else None)
            if self.ssh_authorized_key is not None:
                self.ssh_port = free_loopback_port()
            argv = self._argv(self.layout)
            if restore is not None:
                argv += ["-incoming", "defer"]
            (self.layout.folder / "qemu.argv.json").write_text(json.dumps(argv, indent=1))
            self.qemu = ChildProcess("qemu", argv, self.layout.qemu_log, self.layout.pids)
            wait_for_path(self.layout.qmp_socket, 15.0, self.qemu)
            self.qmp = QmpSession(self.layout.qmp_socket, self.layout.qmp_events)
            try:
                self.qmp.connect()
                if restore is not None:
                    vm_snapshot.load(self, restore, ready_timeout_s)
                self.qmp.execute("cont")
            except QmpError:
                self._raise_if_qemu_exits()  # QEMU made its socket, then gave up: its words, not EOF
                raise
            self.timings["qemu_started_s"] = time.monotonic() - started
            self.agent = GuestAgent(self.layout.agent_socket)
            self.agent.wait_ready(ready_timeout_s, alive=self.check_alive)
            self.timings["guest_ready_s"] = time.monotonic() - started
            if restore is None:
                guest_driver.check_bound(self)  # each cold-plugged model has the driver it names
            else:
                vm_snapshot.resume_guest(self, restore)
            if self.allow_reboot:
                self.qmp.execute("set-action", {"reboot": "reset"})
            self.made_by = "restore" if restore is not None else "boot"
        except BaseException:
            self.stop()
            raise
        return self

    def _argv(self, layout: InstanceLayout) -> list[str]:
        argv = build_argv(self.qemu_binary, self.profile, self.image, layout, self.accel,
                          ssh_forward_port=self.ssh_port)
        return guest_driver.with_iommu(argv, self.profile)  # a model's guest driver may need one

    def configuration_key(self, runtime_config: str | None = None, bare_node: bool = False) -> str:
        """What a saved VM must share with this one to stand in for its boot (vm_snapshot);
        `runtime_config`: the key as if the VM had that runtime config instead of its own;
        `bare_node`: as if its guest ran the reference runtime (not `runtime_module`) and no
        `node_services`."""
        argv = self._argv(InstanceLayout(Path("/instance")))  # the same for every instance folder
        files = self._guest_share_files(runtime_config or self.runtime_config,
                                        None if bare_node else self.runtime_module,
                                        None if bare_node else self.node_services)
        return vm_snapshot.configuration_key(
            argv, {name: data for name, (data, _) in files.items()},
            [self.image.kernel, self.image.initramfs, self.image.rootfs])

    def _guest_share_files(self, runtime_config: str | None, runtime_module: str | None,
                           node_services: str | None) -> dict[str, tuple[bytes, int]]:
        """The run share's files at start: name -> (contents, mode)."""
        files: dict[str, tuple[bytes, int]] = {}
        if runtime_config is not None:
            files["runtime.toml"] = (runtime_config.encode(), 0o644)
        if runtime_module:
            files[RUNTIME_MODULE_FILE] = runtime_module_file(runtime_module)
        if node_services:
            files[NODE_SERVICES_FILE] = (node_services.encode(), 0o644)
        drivers = guest_driver.share_text(self.profile)
        if drivers is not None:
            files[guest_driver.SHARE_FILE] = (drivers.encode(), 0o644)
        if self.ssh_authorized_key is not None:
            files["ssh/authorized_keys"] = ((self.ssh_authorized_key.strip() + "\n").encode(), 0o644)
        return files

    def _write_guest_share(self) -> None:
        self.layout.guest_share.mkdir()
        for name, (data, mode) in self._guest_share_files(self.runtime_config, self.runtime_module,
                                                          self.node_services).items():
            self._put_in_share(name, data, mode)

    def _put_in_share(self, name: str, data: bytes, mode: int) -> None:
        target = self.layout.guest_share / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    def update_run_share(self, name: str, data: bytes, mode: int = 0o644) -> str:
        """Write `name` into the VM's run share and into the guest's copy of it; its guest path.

        The guest runs from a copy of the share (vm-images/guest-init.sh: a mounted 9p share
        blocks migration), so a change the guest must see now goes through the agent; the
        share keeps it for a reboot, which copies the share again.
        """
        self._put_in_share(name, data, mode)
        return self.copy_share_file_to_guest(name)

    def switch_runtime_module(self, module: str) -> None:
        """The guest starts `module` as its runtime from its next runtime start or boot on: a VM
        started (restored) with the reference runtime, for a runtime under test of its own."""
        self.runtime_module = module
        self.update_run_share(RUNTIME_MODULE_FILE, *runtime_module_file(module))

    def start_node_services(self, commands: str) -> None:
        """Run `commands` in the guest now, as its init runs the VM's `node_services` at a boot, and
        keep them as the VM's (the run share and the guest's copy): a VM started (restored) without
        them, for a host with them."""
        self.node_services = commands
        path = self.update_run_share(NODE_SERVICES_FILE, commands.encode())
        self.agent.run(["/bin/sh", path], timeout_s=60).check()

    def copy_share_file_to_guest(self, name: str) -> str:
        """Put the run share's file `name` (already there) into the guest's copy; its guest path."""
        source = self.layout.guest_share / name
        guest_path = f"{GUEST_RUN_SHARE}/{name}"
        if self.agent is not None:
            self.agent.write_file(guest_path, source.read_bytes(), source.stat().st_mode & 0o777)
        return guest_path

    def share_file_in_guest(self, name: str, sha256: str | None = None, timeout_s: float = 600.0) -> str:
        """The guest path of the run share's file `name` (already there), read by the guest straight
        from the share: its bytes never pass through the guest agent, and no copy takes the guest's
        memory (a plugin of 256 MiB in a 512 MiB guest).

        Why not the agent: `GuestAgent.write_file` sends a file base64-encoded in one message; a
        22 MB plugin never arrived (no reply before the deadline). Why not the boot's copy: the
        guest runs from tmpfs copies, and its /run is half its memory. The share (9p, read-only)
        is mounted at GUEST_SHARE_MOUNT on first use and stays mounted: a mounted share blocks
        QEMU's migration, so a VM is saved (vm_snapshot) only before this is called, never after.
        `sha256`: the guest checks the file it will run is that one (InfrastructureError if not)."""
        guest_path = f"{GUEST_SHARE_MOUNT}/{name}"
        mount = shlex.quote(GUEST_SHARE_MOUNT)
        script = (f"grep -qs ' {GUEST_SHARE_MOUNT} 9p ' /proc/mounts || "
                  f"{{ mkdir -p {mount} && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro "
                  f"{SHARE_TAG} {mount}; }} || exit 3; ")
        if sha256 is not None:
            script += f"sha256sum {shlex.quote(guest_path)} | cut -d' ' -f1"
        result = self.agent.shell(script, timeout_s=timeout_s)
        if result.exit_code != 0:
            raise InfrastructureError(f"the guest could not read {name} from its run share "
                                      f"(exit {result.exit_code}): {result.stderr.strip()}")
        if sha256 is not None and result.stdout.strip() != sha256:
            raise InfrastructureError(f"the guest reads {name} from its share with sha256 "
                                      f"{result.stdout.strip() or '?'}, not {sha256}")
        return guest_path

    def queue_backend(self, slot_name: str) -> NbdQueueBackend:
        """The NBD backend of a slot's queue device, started on first use."""
        if slot_name not in self.queues:
            slot = self.profile.slot(slot_name)
            kind = self.profile.kind(slot.device if slot.populated else slot.accepts)
            backend = NbdQueueBackend(self.layout, slot_name, kind.disk_mib)
            backend.start()
            self.queues[slot_name] = backend
        return self.queues[slot_name]

    def reboot(self, ready_timeout_s: float | None = None) -> float:
        """Hard-reset the guest (QMP system_reset) and wait until it is ready again."""
        if not self.allow_reboot:
            raise InfrastructureError("this VM was started without allow_reboot")
        ready_timeout_s = ready_timeout_s or self.profile.budgets.get("guest_ready_s", 90.0)
        started = time.monotonic()
        mark = self.qmp.mark()
        self.qmp.execute("system_reset")
        self.qmp.wait_event("RESET", after=mark, timeout_s=10, alive=self.check_alive)
        self.agent.close()
        self.agent.wait_ready(ready_timeout_s, alive=self.check_alive)
        return time.monotonic() - started

    def _raise_if_qemu_exits(self, within_s: float = QEMU_EXIT_GRACE_S) -> None:
        """QemuDied (with QEMU's last words) if QEMU ends within `within_s`; else return."""
        try:
            self.qemu.popen.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return
        self.check_alive()

    def check_alive(self) -> None:
        """Raise QemuDied (with QEMU's output and the console tail) if QEMU is gone."""
        if self.qemu is None or self.qemu.alive():
            return
        raise QemuDied(
            f"QEMU exited with status {self.qemu.returncode()}.\n"
            f"QEMU output:\n{self.qemu.log_tail()}\nconsole tail:\n{self.console_tail()}"
        )

    # -- held still between users --------------------------------------------------------------
    def pause(self) -> None:
        """Hold the guest still (QMP `stop`) while nobody uses it: an idle guest costs a host core
        under TCG (an a100 host with its runtime took ~10% of one), taken from the
        VMs that work beside it. A VM whose QEMU is gone is left as it is: its next user's
        `check_alive` says so."""
        if self.paused or self._stopped or self.qmp is None or self.qemu is None or not self.qemu.alive():
            return
        self.qmp.execute("stop")
        self.paused = True

    def resume(self) -> None:
        """Let a paused guest run on (`cont`), its wall clock put back to the host's
        (emulators/guest_clock.py: its monotonic clock goes on from where it stopped)."""
        if not self.paused:
            return
        self.qmp.execute("cont")
        self.paused = False
        guest_clock.set_wall_clock(self, f"{self.profile.name}: a resumed guest")

    def stop(self, grace_s: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        _live_vms.discard(self)
        if self.agent is not None:
            self.agent.close()
        if self.qmp is not None:
            if self.qemu is not None and self.qemu.alive():
                for backend in self.queues.values():
                    if backend.stalled:
                        backend.resume()  # a stuck backend can freeze QEMU's quit
                self.models.resume_all()  # so does a hung model server
                try:
                    self.qmp.execute("quit", timeout_s=grace_s)
                except InfrastructureError:
                    pass
            self.qmp.close()
        if self.qemu is not None:
            try:
                self.qemu.popen.wait(timeout=grace_s)
            except Exception:
                pass
            self.qemu.stop()
        for backend in self.queues.values():
            backend.stop()
        self.models.stop()
        if self.layout is not None:
            instance_dir.remove_instance_dir(self.layout.folder, keep=self.keep)

    def __enter__(self) -> EmulatedVM:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- observations ---------------------------------------------------------------------------
    def console_tail(self, limit: int = 4000) -> str:
        return _tail(self.layout.console_log if self.layout else None, limit)

    def console_log(self) -> str:
        return _tail(self.layout.console_log if self.layout else None, 1 << 22)

    def qmp_events_text(self) -> str:
        return _tail(self.layout.qmp_events if self.layout else None, 1 << 22)

    def guest_dmesg(self) -> str:
        return self.agent.run(["dmesg"], timeout_s=20).stdout

    @property
    def pids(self) -> list[int]:
        pids = [self.qemu.pid] if self.qemu else []
        return pids + [b.process.pid for b in self.queues.values() if b.process]

    def node_threads(self) -> list[tuple[int, int]]:
        """(pid, tid) of the host threads this guest runs on: QEMU's virtual CPUs and its vfio-user
        I/O thread, the device models' server threads (in this process) and every thread of the
        NBD queue backends; what the guest waits for when they wait for a CPU
        (emulators/thread_wait.py). QEMU's main loop is left out: it serves QMP and the
        channels beside the guest, not the guest's own work."""
        threads = []  # called from a sampler's thread while the test's adds slots: copies, not views
        if self.qemu is not None:
            threads += thread_wait.process_threads(self.qemu.pid, _runs_the_guest)
        threads += [(os.getpid(), tid) for tid in self.models.thread_ids()]
        for backend in list(self.queues.values()):
            if backend.process is not None:
                threads += thread_wait.process_threads(backend.process.pid)
        return threads

    def guest_cpu_threads(self) -> list[tuple[int, int]]:
        """(pid, tid) of QEMU's virtual CPU threads: the only host threads that run the guest's own
        code (the runtime's timers, its polls, its start), so the only ones whose waits for a CPU can
        delay what the runtime itself must do (emulators/thread_wait.py `acting`)."""
        if self.qemu is None:
            return []
        return thread_wait.process_threads(self.qemu.pid, lambda name: name.startswith("CPU "))


def _runs_the_guest(thread_name: str) -> bool:
    """QEMU's threads that run guest code or answer the device models for it (QEMU names them)."""
    return thread_name.startswith("CPU ") or thread_name == "IO vfio-user"


def runtime_module_file(module: str) -> tuple[bytes, int]:
    """The run share's RUNTIME_MODULE_FILE naming `module`: (contents, mode)."""
    return (module + "\n").encode(), 0o644


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path | None, limit: int) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
