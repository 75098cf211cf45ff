"""Fresh hosts without a boot: a ready VM saved once (QEMU migration to a file), restored per host.

Why: a destructive test needs a host in its just-booted state, and a boot under TCG takes
~16 s (docs/emulated-hosts.md). A VM booted once per configuration and process is saved
right after its runtime's cold discovery, and every later host of that configuration is a
new QEMU that loads the saved stream (`-incoming defer`, `migrate-incoming`) with new
device-model servers loaded with the saved cards' state. What the guest runs is a copy in
tmpfs (vm-images/guest-init.sh unmounts its 9p shares) and its root is mounted read-only, so
the stream and the image it is restored over agree.

What the stream lacks, measured (QEMU 11.1): a vfio-user device's state (QEMU's client sets up
no device migration, and raises no blocker either). Our device-model servers are in this
process, so their cards are carried beside the stream (ModelDevice.saved_state); QEMU's own
virtualised registers of such a device (BARs, command register) come back at their reset
values, so the guest's values are read before the save and written back in the restored guest
(setpci) while the runtime is held (SIGSTOP, then SIGCONT): it never sees them missing.

Shared by a run's processes: a process that calls `share_saved_vms()` (the pytest plugin's
controller does) names a folder in HILCONFORM_SAVED_VMS, which every process it starts inherits
(pytest-xdist workers, the pytest runs of a certify or a self-check inside make test): a VM one
of them saved, the others restore instead of booting it again (one boot per configuration and
run, not per worker and process). A save there is published whole or not at all (the stream,
then its description renamed into place); past SHARED_MAX_BYTES saves stay private. While one
process boots a configuration to save it, it holds a claim on it in that folder (`<key>.booting`,
its pid and start time), and another that wants the same configuration waits for the save
(`SavedVMs.restorable`) instead of booting it beside it: two boots at once on 2 cores take
longer than one boot and a restore. A configuration found never to be saved is published with
why (`<key>.unsaved`), so the others boot it at once.

Only a VM whose QEMU lets it migrate is saved: QEMU names the devices that block it
(`query-migrate`'s `blocked-reasons`; QEMU's nvme, the stock stand-in, is one); such a
configuration keeps booting, and `SavedVMs.why_booted` says why.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import guest_clock, instance_dir
from .errors import InfrastructureError
from .pci_inventory import function_below, query_pci
from .process_identity import ProcessIdentity, read_pid_file
from .waiting import poll_until

SAVE_TIMEOUT_S = 60.0
MAX_SAVED = 4  # private streams kept per process (~120 MiB each); the oldest goes first
SHARED_ENV = "HILCONFORM_SAVED_VMS"  # the folder a run's processes share saved VMs in
SHARED_MAX_BYTES = 4 << 30  # streams in that folder, at most
SHARED_SUFFIX = ".saved"  # a published SavedVM's description (its stream beside it)
CLAIM_SUFFIX = ".booting"  # a process of the run is booting this configuration to save it
UNSAVED_SUFFIX = ".unsaved"  # why this configuration is never saved (a line of text)
BOOT_WAIT_S = 180.0  # how long a process waits for another's boot and save; then it boots too
CLAIM_POLL_S = 0.2


@dataclass(frozen=True)
class SavedVM:
    """One saved ready VM: QEMU's migration stream and the device-model cards' state."""

    key: str  # the configuration it was saved from (EmulatedVM.configuration_key)
    stream: Path
    card_states: dict = field(repr=False)  # slot -> ModelDevice.saved_state()
    guest_registers: str = ""  # setpci arguments that put the model devices' registers back
    size_bytes: int = 0


# The registers of a vfio-user device that QEMU virtualises and does not migrate (setpci names).
VIRTUALISED = ("BASE_ADDRESS_0", "BASE_ADDRESS_1", "BASE_ADDRESS_2", "BASE_ADDRESS_3",
               "BASE_ADDRESS_4", "BASE_ADDRESS_5", "ROM_ADDRESS", "COMMAND")
HOLD_RUNTIME = "pid=$(cat /run/hilconform/runtime.pid 2>/dev/null) && kill -{} $pid 2>/dev/null; true"


def migration_blockers(qmp) -> list[str]:
    """What QEMU says stops this VM from migrating now (empty: nothing)."""
    return list(qmp.execute("query-migrate", timeout_s=10).get("blocked-reasons", []))


def save(vm, key: str, stream: Path) -> SavedVM:
    """Save the running `vm` (of configuration `key`) into `stream` and let it run on;
    InfrastructureError if QEMU fails.

    The VM is paused for the save (the cards' state and the stream are taken at one moment)
    and continues afterwards: the VM saved is the VM the first test gets.
    """
    guest_registers = _model_registers(vm)
    vm.agent.shell(HOLD_RUNTIME.format("STOP"), timeout_s=20)
    vm.qmp.execute("stop")
    try:
        card_states = vm.models.saved_states()
        vm.qmp.execute("migrate", {"uri": f"exec:cat > {stream}"}, timeout_s=30)
        deadline = time.monotonic() + SAVE_TIMEOUT_S
        while True:
            status = vm.qmp.execute("query-migrate", timeout_s=10)
            if status.get("status") == "completed":
                break
            if status.get("status") in ("failed", "cancelled") or time.monotonic() > deadline:
                stream.unlink(missing_ok=True)
                raise InfrastructureError(f"saving {vm.profile.name} failed: "
                                          f"{status.get('status')} {status.get('error-desc', '')}")
            time.sleep(0.05)
    finally:
        vm.qmp.execute("cont")
        vm.agent.shell(HOLD_RUNTIME.format("CONT"), timeout_s=20)
    return SavedVM(key, stream, card_states, guest_registers, stream.stat().st_size)


def resume_guest(vm, saved: SavedVM) -> None:
    """In a restored guest, now running: the wall clock set to the host's (it stood still while
    saved; emulators/guest_clock.py) and the model devices' registers back, in one command; then
    the runtime released."""
    also = f"setpci {saved.guest_registers}" if saved.guest_registers else ""
    guest_clock.set_wall_clock(vm, "restored guest", also)
    vm.agent.shell(HOLD_RUNTIME.format("CONT"), timeout_s=20)


def _model_registers(vm) -> str:
    """`-s BDF REG=VALUE ...` for every model device the guest has (what a restore writes back)."""
    truth = query_pci(vm.qmp)
    bdfs = [function_below(truth, slot.port_id) for slot in vm.profile.slots
            if slot.populated and vm.profile.kind(slot.device).model]
    arguments = []
    for bdf in filter(None, bdfs):
        result = vm.agent.run(["setpci", "-s", bdf, *VIRTUALISED], timeout_s=20)
        values = result.stdout.split()
        if result.exit_code != 0 or len(values) != len(VIRTUALISED):
            raise InfrastructureError(f"could not read {bdf}'s registers in the guest: "
                                      f"{result.stderr.strip()}")
        pairs = zip(VIRTUALISED, values, strict=True)
        arguments += ["-s", bdf] + [f"{name}={value}" for name, value in pairs]
    return " ".join(arguments)


def load(vm, saved: SavedVM, timeout_s: float) -> None:
    """Feed `saved` into `vm`'s QEMU, started with `-incoming defer`; returns once it is loaded."""
    if saved.key != vm.configuration_key():
        raise InfrastructureError(f"saved VM {saved.stream} is of another configuration")
    vm.qmp.execute("migrate-incoming", {"uri": f"exec:cat {saved.stream}"}, timeout_s=10)
    poll_until(lambda: vm.qmp.execute("query-status", timeout_s=10)["status"] != "inmigrate", timeout_s,
               f"QEMU loading {saved.stream}", every_s=0.02,
               check=vm.check_alive)  # a stream QEMU cannot load ends QEMU, with its words


class SavedVMs:
    """The saved VMs this process can restore, by configuration: its own (streams in one instance
    folder, at most `limit`) and those published in the `shared` folder by any process of the run."""

    def __init__(self, limit: int = MAX_SAVED, shared: Path | None = None):
        self.limit = limit
        self.shared = shared
        self._saved: dict[str, SavedVM] = {}
        self.why_booted: dict[str, str] = {}  # configuration key -> why it is not saved
        self._folder: Path | None = None

    def get(self, key: str) -> SavedVM | None:
        saved = self._saved.get(key)
        if saved is None and self.shared is not None:
            saved = _read_published(self.shared, key)
        return saved

    def blocked(self, vm, key: str) -> bool:
        """Whether QEMU refuses to migrate `vm` (of configuration `key`); its reason is kept."""
        blockers = migration_blockers(vm.qmp)
        if blockers:
            self.never_saved(key, "; ".join(blockers))
        return bool(blockers)

    def never_saved(self, key: str, why: str) -> None:
        """Hosts of configuration `key` boot, for `why`: kept, and told to the run's other processes."""
        self.why_booted[key] = why
        if self.shared is not None:
            partial = self.shared / f"{key}{UNSAVED_SUFFIX}.{os.getpid()}.partial"
            partial.write_text(why)
            os.replace(partial, self.shared / (key + UNSAVED_SUFFIX))

    def restorable(self, key: str, wait_s: float = BOOT_WAIT_S, while_waiting=None) -> SavedVM | None:
        """The saved VM of configuration `key`, if there is one or another process of the run is
        booting that configuration to save it (then once it is saved: waited for, up to `wait_s`).
        None: this process boots it, and holds the claim on it until `release(key)`; or the
        configuration is never saved (`why_booted` says why). `while_waiting()`: called once if
        this process has to wait, to use the time (boot and save another configuration the run
        will want: fixtures/fresh_host.py)."""
        deadline = time.monotonic() + wait_s
        while True:
            saved = self.get(key)
            if saved is not None or key in self.why_booted or self.shared is None:
                return saved
            why = _read_text(self.shared / (key + UNSAVED_SUFFIX))
            if why is not None:
                self.why_booted[key] = why
                return None
            if _claim(self.shared / (key + CLAIM_SUFFIX)) or time.monotonic() > deadline:
                return None
            if while_waiting is not None:
                while_waiting, use_the_wait = None, while_waiting
                use_the_wait()
                continue
            time.sleep(CLAIM_POLL_S)

    def claim_if_free(self, key: str) -> bool:
        """Take the claim on booting `key` when nobody saved, claimed or gave up on it; whether
        this process now holds it (then `release(key)` it). Never waits."""
        if self.shared is None or key in self.why_booted:
            return False
        if (self.shared / (key + UNSAVED_SUFFIX)).exists() or not _claim(self.shared / (key + CLAIM_SUFFIX)):
            return False
        if self.get(key) is not None:  # saved already (a save leaves no claim to refuse this one)
            self.release(key)
            return False
        return True

    def release(self, key: str) -> None:
        """Give up this process's claim on booting `key` (saved, never saved, or the boot failed:
        a process waiting for it then restores it, is told why not, or boots it itself)."""
        if self.shared is None:
            return
        claim = self.shared / (key + CLAIM_SUFFIX)
        try:
            if read_pid_file(claim).pid == os.getpid():
                claim.unlink()
        except (OSError, ValueError):
            pass

    def remember(self, vm, key: str) -> SavedVM | None:
        """Save `vm` (just made ready, of configuration `key`) unless that configuration is saved
        or cannot be; the saved VM."""
        known = self.get(key)
        if known is not None or key in self.why_booted or self.blocked(vm, key):
            return known
        if self.shared is not None and _stream_bytes(self.shared) < SHARED_MAX_BYTES:
            saved = save(vm, key, self.shared / f"{key[:32]}-{os.getpid()}.stream")
            _publish(self.shared, saved)
            return saved
        while len(self._saved) >= self.limit:
            oldest = next(iter(self._saved))
            self._saved.pop(oldest).stream.unlink(missing_ok=True)
        saved = save(vm, key, self.folder() / f"{key[:16]}.stream")
        self._saved[key] = saved
        return saved

    def folder(self) -> Path:
        if self._folder is None:
            self._folder = instance_dir.make_instance_dir("saved")
        return self._folder

    def clear(self) -> None:
        self._saved.clear()
        if self._folder is not None:
            instance_dir.remove_instance_dir(self._folder)
            self._folder = None


def _publish(folder: Path, saved: SavedVM) -> None:
    """Make `saved` (its stream already in `folder`) visible to the run's other processes."""
    description = folder / (saved.key + SHARED_SUFFIX)
    partial = description.with_name(f"{description.name}.{os.getpid()}.partial")
    partial.write_bytes(pickle.dumps(saved))
    os.replace(partial, description)  # a reader sees all of it or nothing


def _claim(path: Path) -> bool:
    """Take the claim at `path` for this process: True if it is ours now (or was), False while a
    live process holds it. A claim whose process is gone (a crashed worker) is taken over."""
    me = ProcessIdentity.of(os.getpid()).to_text()
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                holder = read_pid_file(path)
            except FileNotFoundError:
                continue  # released just now: try again
            except (OSError, ValueError):
                return False  # being written (or unreadable): a live claim until proved otherwise
            if holder.pid == os.getpid():
                return True
            try:
                gone = holder.identity is None or holder.identity.mismatch() is not None
            except OSError:
                gone = False
            if not gone:
                return False
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as out:
            out.write(me)
        return True


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _read_published(folder: Path, key: str) -> SavedVM | None:
    """The SavedVM some process of the run published for `key`, if any (our own files only:
    the folder is private to the run, made by share_saved_vms)."""
    try:
        saved = pickle.loads((folder / (key + SHARED_SUFFIX)).read_bytes())
    except FileNotFoundError:
        return None
    if not isinstance(saved, SavedVM) or saved.key != key or not saved.stream.exists():
        raise InfrastructureError(f"the shared saved VM {folder / (key + SHARED_SUFFIX)} is not one")
    return saved


def _stream_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("*.stream"))


def share_saved_vms() -> Path | None:
    """Start sharing saved VMs with every process this one starts from now on (HILCONFORM_SAVED_VMS);
    the folder, for stop_sharing, or None where this process already shares its parent's."""
    global _process_saved
    if os.environ.get(SHARED_ENV):
        return None
    folder = instance_dir.make_instance_dir("shared-saved")
    folder.chmod(0o700)
    os.environ[SHARED_ENV] = str(folder)
    _process_saved = None  # the next saved_vms() shares it too
    return folder


def stop_sharing(folder: Path) -> None:
    """End what share_saved_vms started: its folder and every stream in it removed."""
    if os.environ.get(SHARED_ENV) == str(folder):
        del os.environ[SHARED_ENV]
    instance_dir.remove_instance_dir(folder)


def configuration_key(argv: list[str], share_files: dict[str, bytes], files: list[Path]) -> str:
    """A digest of what makes two VMs the same: QEMU's command line (instance paths as given),
    the run share's files and the identity (size, mtime) of the files the VM boots from."""
    digest = hashlib.sha256(json.dumps(argv).encode())
    for name, data in sorted(share_files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    for path in files:
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def start_bare_vm(vm):
    """Start `vm`, a VM without a runtime (an emulator-level test's), restored from the run's
    saved VM of its configuration, or booted and then saved for the next one; the VM (`made_by`
    says which). A VM with a runtime is saved only once its runtime is quiet: the host factory's
    fixtures/fresh_host.py does that. A VM with sshd (its root writable) or one QEMU cannot
    migrate just boots."""
    if vm.runtime_config is not None:
        raise ValueError("start_bare_vm is for VMs without a runtime (fixtures/fresh_host.py "
                         "saves a host once its runtime is quiet)")
    if vm.ssh_authorized_key is not None:
        return vm.start()
    saved_vms_now = saved_vms()
    key = vm.configuration_key()
    try:
        saved = saved_vms_now.restorable(key)
        if saved is not None:
            return vm.start(restore=saved)
        vm.start()
        saved_vms_now.remember(vm, key)
        return vm
    finally:
        saved_vms_now.release(key)


_process_saved: SavedVMs | None = None


def saved_vms() -> SavedVMs:
    """The process's saved VMs (its own removed at exit), sharing the run's folder if it has one."""
    global _process_saved
    if _process_saved is None:
        shared = os.environ.get(SHARED_ENV)
        _process_saved = SavedVMs(shared=Path(shared) if shared else None)
        atexit.register(_process_saved.clear)
    return _process_saved
