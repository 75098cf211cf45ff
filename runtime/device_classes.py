"""Per-class hooks (queue probe, firmware version, interrupt readiness).

Chosen from IDs, class and driver.

Why: hot-add and hot-remove are generic procedures; what "queue drained",
"firmware version" and "interrupts ready" mean differs per device class.
"""

from __future__ import annotations

import os
import tomllib

from .inventory import DeviceInfo
from .sysfs import PCI_DEVICES, Sysfs

# QEMU's edu and pci-testdev have no Linux driver: nothing binds, which is fine.
DRIVERLESS_IDS = frozenset({"1234:11e8", "1b36:0005"})
_CONFIG_KEYS = ("firmware", "driverless", "models")
MODEL_REGISTERS_PATH = os.path.join(os.path.dirname(__file__), "model_registers.toml")
ALL_ONES = 0xFFFFFFFF
UDEV_DATA = ("run", "udev", "data")  # udev's database: an entry per device it finished processing


class DeviceUnreachable(OSError):
    """The device's registers read all ones: it fell off the bus (or lost its configuration)."""


def load_model_registers(path: str = MODEL_REGISTERS_PATH) -> dict[str, int]:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


class ClassHooks:
    """Generic PCI function: no queue probe, no firmware version, a driver is required."""

    name = "generic"

    def __init__(self, firmware_override: str | None = None, requires_driver: bool = True):
        self.firmware_override = firmware_override
        self.requires_driver = requires_driver

    def queue_depth(self, sysfs: Sysfs, bdf: str) -> int | None:
        """Commands in flight; None means this class has no queue probe (drain is a no-op)."""
        return None

    def firmware_version(self, sysfs: Sysfs, bdf: str, info: DeviceInfo) -> str | None:
        """Firmware version (the configured per-ID override wins), None when unknown."""
        if self.firmware_override is not None:
            return self.firmware_override
        return self._read_firmware(sysfs, bdf)

    def _read_firmware(self, sysfs: Sysfs, bdf: str) -> str | None:
        return None

    def interrupts_ready(self, sysfs: Sysfs, bdf: str, info: DeviceInfo) -> bool:
        """Driver bound, MSI/MSI-X enabled, or MSI vectors allocated.

        Always True for classes that need no driver (QEMU edu, pci-testdev).
        """
        if not self.requires_driver:
            return True
        if sysfs.driver(bdf) is not None or sysfs.msi_irqs(bdf):
            return True
        caps = info.capabilities
        return bool(caps.get("msi_enabled") or caps.get("msix_enabled"))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} requires_driver={self.requires_driver}>"


class BlockHooks(ClassHooks):
    """Mass storage with block devices below it (virtio-blk, SCSI HBAs): in-flight requests."""

    name = "block"

    def queue_depth(self, sysfs: Sysfs, bdf: str) -> int | None:
        inflight = sysfs.block_inflight(bdf)
        return None if inflight is None else sum(inflight)


class NvmeHooks(BlockHooks):
    """NVMe controller: queue = in-flight requests of its namespaces, else their other openers,
    firmware = nvme/nvmeN/firmware_rev.

    The queue depth is 0 (not None) while no namespace is visible: nothing
    can be in flight through the block layer then.
    """

    name = "nvme"

    def queue_depth(self, sysfs: Sysfs, bdf: str) -> int | None:
        """In-flight requests of its namespaces; while none is in flight, the open files of a
        namespace other processes hold: a reader between two requests (udev's blkid probe after
        a change uevent reads block after block) submits the next one a moment later, and a
        request submitted once bus mastering is off is lost until the driver's 30 s timeout.

        The open files are looked for only when nothing is in flight: the scan of /proc costs
        12 ms (median, idle TCG guest; 60 ms just after boot), and a drain polling a busy queue
        every few milliseconds would spend its timeout scanning (HP-02 drains took 388 ms)."""
        inflight = super().queue_depth(sysfs, bdf) or 0
        return inflight or self._namespace_openers(sysfs, bdf)

    def _namespace_openers(self, sysfs: Sysfs, bdf: str) -> int:
        names = {p.rsplit("/", 1)[-1] for p in sysfs.glob(*PCI_DEVICES, bdf, "nvme", "nvme*", "nvme*n*")}
        if not names:
            return 0
        proc = sysfs.path("proc")
        try:
            pids = [p for p in os.listdir(proc) if p.isdigit() and p != str(os.getpid())]
        except OSError:
            return 0
        openers = 0
        for pid in pids:
            fd_dir = os.path.join(proc, pid, "fd")
            try:
                fds = os.listdir(fd_dir)
            except OSError:  # gone, or not ours to look at
                continue
            for fd in fds:
                try:
                    target = os.readlink(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                node = target[len("/dev/"):] if target.startswith("/dev/") else None
                if node and any(node == n or node.startswith(n + "p") for n in names):
                    openers += 1
        return openers

    def interrupts_ready(self, sysfs: Sysfs, bdf: str, info: DeviceInfo) -> bool:
        """As every class, and the node done setting the controller up: the nvme driver's
        controller made and `live` (before, its serial may read "(efault)") and, where udev
        runs, udev done with every namespace's block device (its database entry written:
        blkid's probe read is over). A removal started while udev still reads a namespace
        leaves that read stuck once bus mastering is off, and the kernel's removal waits for it
        (del_gendisk)."""
        if not super().interrupts_ready(sysfs, bdf, info):
            return False
        controllers = sysfs.glob(*PCI_DEVICES, bdf, "nvme", "nvme*")
        if not controllers and sysfs.driver(bdf) == "nvme":
            return False  # the driver's link comes before its probe has made the controller
        states = [s for s in (sysfs.read_text(c, "state") for c in controllers) if s is not None]
        if states and "live" not in states:
            return False
        if not os.path.isdir(sysfs.path(*UDEV_DATA)):
            return True
        for dev_file in (f for c in controllers for f in sysfs.glob(c, "nvme*n*", "dev")):
            numbers = sysfs.read_text(dev_file)
            if numbers and not os.path.exists(sysfs.path(*UDEV_DATA, f"b{numbers}")):
                return False
        return True

    def _read_firmware(self, sysfs: Sysfs, bdf: str) -> str | None:
        for path in sysfs.glob(*PCI_DEVICES, bdf, "nvme", "nvme*", "firmware_rev"):
            value = sysfs.read_text(path)
            if value:
                return value
        return None


class NvidiaGpuHooks(ClassHooks):
    """NVIDIA GPU on a real host: firmware = the VBIOS version the driver reports in /proc."""

    name = "nvidia_gpu"

    def _read_firmware(self, sysfs: Sysfs, bdf: str) -> str | None:
        text = sysfs.read_text("proc", "driver", "nvidia", "gpus", bdf, "information") or ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() == "video bios" and value.strip():
                return value.strip()
        return None


class ModelHooks(ClassHooks):
    """A hilconform device model (vfio-user): its BAR0 register file read through sysfs ``resource0``.

    That mapping is the user-space driver path real accelerator stacks use. queue = the
    in-flight counter, firmware = the version register; all ones means the device fell
    off the bus (DeviceUnreachable), never a huge queue or a version.
    """

    name = "model"
    registers = load_model_registers()

    def __init__(self, firmware_override: str | None = None, requires_driver: bool = False):
        super().__init__(firmware_override, requires_driver)

    def read_register(self, sysfs: Sysfs, bdf: str, name: str) -> int | None:
        """One 32-bit register; None when resource0 cannot be read (no BAR, no rights, gone)."""
        if sysfs.attr(bdf, "enable") == "0":  # no driver enabled memory decoding: do it as vfio would
            try:
                sysfs.write_attr(bdf, "enable", "1")
            except OSError:
                pass
        data = sysfs.read_mmio(bdf, 0, self.registers[name], 4)
        if data is None:
            return None
        value = int.from_bytes(data, "little")
        if value == ALL_ONES:
            raise DeviceUnreachable(f"{bdf}: BAR0 register {name} reads all ones (fell off the bus?)")
        return value

    def _checked(self, sysfs: Sysfs, bdf: str, name: str) -> int | None:
        magic = self.read_register(sysfs, bdf, "magic")
        if magic is None:
            return None
        if magic != self.registers["magic_value"]:
            raise DeviceUnreachable(f"{bdf}: BAR0 magic reads {magic:#010x}, not a device model's")
        return self.read_register(sysfs, bdf, name)

    def queue_depth(self, sysfs: Sysfs, bdf: str) -> int | None:
        """The in-flight counter; raises DeviceUnreachable (all ones), OSError if unreadable."""
        depth = self._checked(sysfs, bdf, "queue_in_flight")
        if depth is None:
            raise OSError(f"{bdf}: resource0 unreadable: no queue probe")
        return depth

    def _read_firmware(self, sysfs: Sysfs, bdf: str) -> str | None:
        try:
            value = self._checked(sysfs, bdf, "firmware_version")
        except OSError:
            return None
        if value is None:
            return None
        return f"{value >> 16}.{value >> 8 & 0xFF}.{value & 0xFF}"  # major is 16 bits


def hooks_for(info: DeviceInfo, config: dict | None = None) -> ClassHooks:
    """Hooks for a device, chosen by class code, then vendor, then bound driver.

    ``config`` is the runtime TOML's class table, e.g.
    {"firmware": {"1b36:0010": "1.0"}, "driverless": ["1234:11e8"], "models": ["10de:20b0"]}:
    devices with those IDs report that firmware version (emulated devices report
    what their host profile says) / need no driver / are device models (ModelHooks,
    chosen first: their firmware is the register's, never an override). Unknown
    keys raise ValueError.
    """
    config = config or {}
    for key in config:
        if key not in _CONFIG_KEYS:
            raise ValueError(f"device classes: unknown key {key!r} (known: {', '.join(_CONFIG_KEYS)})")
    firmware = config.get("firmware", {})
    if not isinstance(firmware, dict):
        raise ValueError("device classes 'firmware' must be a table of 'vvvv:dddd' = 'version'")
    driverless = DRIVERLESS_IDS | {str(i).lower() for i in config.get("driverless", [])}
    models = {str(i).lower() for i in config.get("models", [])}
    if info.ids in models:  # its registers are read directly (sysfs resource0), whatever driver is bound
        return ModelHooks(firmware_override=None, requires_driver=False)
    override = firmware.get(info.ids)
    kwargs = {
        "firmware_override": None if override is None else str(override),
        "requires_driver": info.ids not in driverless,
    }
    if info.class_code == 0x010802 or info.driver == "nvme":
        return NvmeHooks(**kwargs)
    if info.vendor_id == 0x10DE and info.class_code >> 16 == 0x03:
        return NvidiaGpuHooks(**kwargs)
    if info.class_code >> 16 == 0x01:
        return BlockHooks(**kwargs)
    return ClassHooks(**kwargs)
