"""All file access of the runtime's device layer goes through :class:`Sysfs`.

Why: the runtime runs as root on real hosts and in the guest, but its unit
tests run against a fake tree in a temporary folder (``root``), so nothing in
the runtime may open ``/sys`` (or ``/proc``, ``/dev``) directly.

Reads that fail for want of the runtime's own resources (EMFILE, ENOMEM, ...)
raise own_resources.OwnResourcesShort instead of reading as "absent" or
"unreadable": such a failure says nothing about the device.
"""

from __future__ import annotations

import errno
import fnmatch
import mmap
import os
import re

from .own_resources import inconclusive_from
from .pciconfig import HEADER_SIZE, sparse_config

PCI_DEVICES = ("sys", "bus", "pci", "devices")
PCI_SLOTS = ("sys", "bus", "pci", "slots")
BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
AER_CATEGORIES = ("correctable", "nonfatal", "fatal")
_BLOCK_WALK_DEPTH = 6


class Sysfs:
    """sysfs and friends below ``root`` ("/" in production, a tmp dir in tests)."""

    def __init__(self, root: str = "/"):
        self.root = os.path.realpath(root)

    # --- paths -----------------------------------------------------------
    def path(self, *parts: str) -> str:
        """Absolute path of ``parts`` (relative to root: ``path("sys", "bus", "pci")``)."""
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def read_text(self, *parts: str) -> str | None:
        """Stripped text of a file below root (``read_text("proc", "cmdline")``); None on error."""
        return _read_text(self.path(*parts))

    def glob(self, *parts: str) -> list[str]:
        """Sorted paths matching the pattern ``parts``, relative to root (for read_text).

        Not the glob module: it reads a folder it cannot open (EMFILE) as empty.
        """
        found = [self.root]
        for pattern in "/".join(p.strip("/") for p in parts).split("/"):
            if not pattern:
                continue
            if not any(c in pattern for c in "*?["):
                found = [os.path.join(d, pattern) for d in found]
                continue
            found = [os.path.join(d, n) for d in found for n in _listdir(d) if _glob_match(n, pattern)]
        return sorted(os.path.relpath(p, self.root) for p in found if os.path.lexists(p))

    def device_path(self, bdf: str, *parts: str) -> str:
        """Path of devices/BDF[/parts] (the bus link, not the resolved device folder)."""
        return self.path(*PCI_DEVICES, bdf, *parts)

    # --- enumeration -------------------------------------------------------
    def pci_addresses(self) -> list[str]:
        """Sorted BDFs ("0000:01:00.0") under sys/bus/pci/devices."""
        return sorted(n for n in _listdir(self.path(*PCI_DEVICES)) if BDF_RE.match(n))

    def exists(self, bdf: str) -> bool:
        try:
            os.stat(self.device_path(bdf))
        except (OSError, ValueError) as exc:
            inconclusive_from(exc, f"{bdf}: presence")
            return False
        return True

    def parent_bdf(self, bdf: str) -> str | None:
        """BDF of the bridge/port above the device (from its resolved path); None on a root bus."""
        parent = os.path.basename(os.path.dirname(os.path.realpath(self.device_path(bdf))))
        return parent if BDF_RE.match(parent) else None

    # --- attributes --------------------------------------------------------
    def read_config_header(self, bdf: str) -> bytes:
        """The ``config`` file's 64-byte header (IDs, command, BARs). Raises OSError.

        What a health checkpoint needs: 16 config reads instead of the 64 of the legacy space and
        the extended capabilities' (each a bus transaction; a device model's goes over vfio-user).
        """
        try:
            with open(self.device_path(bdf, "config"), "rb", buffering=0) as f:
                return f.read(HEADER_SIZE)
        except OSError as exc:
            inconclusive_from(exc, f"{bdf}: config read")
            raise

    def read_config(self, bdf: str, full: bool = False) -> bytes:
        """The ``config`` file: 64 B unprivileged, else 256 B or 4 KiB. Raises OSError.

        By default only the parts of the extended space that the parser uses
        are read (the rest is zero; see pciconfig.sparse_config): config reads
        are slow bus transactions. ``full=True`` reads every byte (for dumps).
        """
        try:
            with open(self.device_path(bdf, "config"), "rb", buffering=0) as f:
                if full:
                    return f.read(4096)
                legacy = f.read(256)
                if len(legacy) < 256 or os.fstat(f.fileno()).st_size <= 256:
                    return legacy
                fd = f.fileno()
                return sparse_config(legacy, lambda offset, size: os.pread(fd, size, offset))
        except OSError as exc:
            inconclusive_from(exc, f"{bdf}: config read")
            raise

    def attr(self, bdf: str, name: str) -> str | None:
        """Stripped text of devices/BDF/NAME; None if absent or unreadable."""
        return _read_text(self.device_path(bdf, name))

    def write_attr(self, bdf: str, name: str, value: str) -> None:
        """Write devices/BDF/NAME in one write(2); raises OSError naming the path."""
        _write_text(self.device_path(bdf, name), value)

    def driver(self, bdf: str) -> str | None:
        """Basename of the ``driver`` link, None when unbound."""
        try:
            return os.path.basename(os.readlink(self.device_path(bdf, "driver")))
        except OSError as exc:
            inconclusive_from(exc, f"{bdf}: driver link")
            return None

    def resources(self, bdf: str) -> list[tuple[int, int, int]]:
        """(start, end, flags) per line of ``resource`` (line i = BAR i, 6 = ROM); [] if absent."""
        text = self.attr(bdf, "resource")
        out: list[tuple[int, int, int]] = []
        for line in (text or "").splitlines():
            fields = line.split()
            try:
                start, end, flags = (int(x, 16) for x in fields[:3])
            except ValueError:
                break
            out.append((start, end, flags))
        return out

    def numa_node(self, bdf: str) -> int | None:
        """NUMA node, None when unknown (sysfs says -1, or no such file)."""
        value = _to_int(self.attr(bdf, "numa_node"), 10)
        return value if value is not None and value >= 0 else None

    def reset_methods(self, bdf: str) -> list[str]:
        """Entries of ``reset_method`` in kernel order; [] if absent (no reset; kernel < 5.15)."""
        return (self.attr(bdf, "reset_method") or "").split()

    def msi_irqs(self, bdf: str) -> list[int]:
        """IRQ numbers of allocated MSI/MSI-X vectors (the ``msi_irqs`` folder)."""
        return sorted(int(n) for n in _listdir(self.device_path(bdf, "msi_irqs")) if n.isdigit())

    # --- slots -------------------------------------------------------------
    def slot_of(self, bdf: str) -> str | None:
        """Name N of bus/pci/slots/N whose ``address`` is this device's domain:bus:dev."""
        device_address = bdf.rsplit(".", 1)[0]
        bus_address = device_address.rsplit(":", 1)[0]
        for slot in sorted(_listdir(self.path(*PCI_SLOTS))):
            address = _read_text(self.path(*PCI_SLOTS, slot, "address"))
            if address in (device_address, bus_address):
                return slot
        return None

    def slot_power(self, slot: str, on: bool) -> None:
        """Write 1/0 to bus/pci/slots/N/power; raises OSError naming the path."""
        _write_text(self.path(*PCI_SLOTS, slot, "power"), "1" if on else "0")

    def slot_attr(self, slot: str, name: str) -> str | None:
        return _read_text(self.path(*PCI_SLOTS, slot, name))

    # --- device memory and queues --------------------------------------
    def read_mmio(self, bdf: str, bar: int, offset: int = 0, size: int = 4) -> bytes | None:
        """``size`` bytes at ``offset`` of BAR ``bar`` via resourceN: mmap (memory BARs),
        else pread (I/O BARs, plain files); None when not possible (no BAR, no rights, gone).
        The kernel copies the bytes (``_mmap_read``: a mapping revoked under the read is None,
        never a SIGBUS that kills the runtime).
        """
        path = self.device_path(bdf, f"resource{bar}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            inconclusive_from(exc, f"{bdf}: BAR{bar} read")
            return None
        try:
            length = os.fstat(fd).st_size
            if length and offset + size > length:
                return None
            data = _mmap_read(fd, offset, size)
            if data is None:
                data = os.pread(fd, size, offset)
            return data if len(data) == size else None
        except OSError as exc:
            inconclusive_from(exc, f"{bdf}: BAR{bar} read")
            return None
        finally:
            os.close(fd)

    def block_inflight(self, bdf: str) -> tuple[int, int] | None:
        """Sum of (reads, writes) in flight over block devices below the device; None if none.

        nvme is looked up directly (nvme/nvme*/nvme*n*/inflight, polled during
        drains); other classes by a shallow walk that stops at child PCI functions.
        """
        paths = self.glob(*PCI_DEVICES, bdf, "nvme", "nvme*", "nvme*n*", "inflight")
        if not paths:
            paths = self._walk_inflight(bdf)
        total, found = [0, 0], False
        for p in paths:
            fields = (self.read_text(p) or "").split()
            if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
                total[0] += int(fields[0])
                total[1] += int(fields[1])
                found = True
        return (total[0], total[1]) if found else None

    def _walk_inflight(self, bdf: str) -> list[str]:
        """Root-relative paths of ``inflight`` files of block devices below the device."""
        top = os.path.realpath(self.device_path(bdf))
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top, onerror=_raise_own_resource_error):
            depth = dirpath[len(top) :].count(os.sep)
            if "inflight" in filenames and "dev" in filenames and dirpath != top:
                found.append(os.path.relpath(os.path.join(dirpath, "inflight"), self.root))
                dirnames[:] = []  # partitions are counted in their disk
                continue
            dirnames[:] = [
                d
                for d in dirnames
                if depth < _BLOCK_WALK_DEPTH and not BDF_RE.match(d) and d not in ("power", "msi_irqs")
            ]
        return found

    # --- errors and placement -------------------------------------------
    def aer_counters(self, bdf: str) -> dict[str, dict[str, int]]:
        """{"correctable"|"nonfatal"|"fatal": {NAME: count}} from aer_dev_*; {} if no AER."""
        out: dict[str, dict[str, int]] = {}
        for category in AER_CATEGORIES:
            text = self.attr(bdf, f"aer_dev_{category}")
            if text is None:
                continue
            counts: dict[str, int] = {}
            for line in text.splitlines():
                fields = line.split()
                if len(fields) == 2 and fields[1].isdigit():
                    counts[fields[0]] = int(fields[1])
            out[category] = counts
        return out

    def aer_rootport_totals(self, bdf: str) -> dict[str, int]:
        """{"cor"|"fatal"|"nonfatal": n} from aer_rootport_total_err_* (root ports); {} if absent.

        An error injected at a root port is counted here, not on the endpoint below.
        """
        out: dict[str, int] = {}
        for kind in ("cor", "fatal", "nonfatal"):
            value = _to_int(self.attr(bdf, f"aer_rootport_total_err_{kind}"), 10)
            if value is not None:
                out[kind] = value
        return out


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError as exc:
        inconclusive_from(exc, f"reading {path}")
        return None


def _listdir(path: str) -> list[str]:
    """Names in a folder; [] when it is absent or unreadable (not for want of resources)."""
    try:
        return os.listdir(path)
    except OSError as exc:
        inconclusive_from(exc, f"listing {path}")
        return []


def _glob_match(name: str, pattern: str) -> bool:
    """glob's rule: a wildcard does not match a leading dot."""
    return (not name.startswith(".") or pattern.startswith(".")) and fnmatch.fnmatchcase(name, pattern)


def _raise_own_resource_error(exc: OSError) -> None:
    inconclusive_from(exc, f"walking {exc.filename}")


def _write_text(path: str, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open {path} for writing: {exc.strerror}", path) from None
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise OSError(exc.errno, f"writing {value!r} to {path} failed: {exc.strerror}", path) from None
    finally:
        os.close(fd)


def _to_int(text: str | None, base: int) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def _mmap_read(fd: int, offset: int, size: int) -> bytes | None:
    """Read via a mapping of the page(s) holding [offset, offset+size); None if mmap fails, b""
    when the mapping is revoked under the read.

    Why the bytes are copied by the kernel (written from the mapping into a pipe) and never
    loaded by Python: a BAR mapping can be revoked between the mmap and the load (a driver
    probing the device claims the BAR: IO_STRICT_DEVMEM zaps user mappings of it; the device
    leaves: its resource file goes). A load from a revoked mapping is SIGBUS, which kills the
    whole runtime (seen: hot-add self-checks racing the nvme driver's probe under load); the
    kernel's copy reports it as EFAULT instead. The copy may use narrower accesses than
    ``size``: a device register read this way is read byte by byte on some CPUs.
    """
    if not 0 < size <= _MMIO_MAX_READ:
        raise ValueError(f"BAR reads are 1..{_MMIO_MAX_READ} bytes, not {size}")
    page = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapped = mmap.mmap(fd, offset - page + size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
    except (OSError, ValueError) as exc:
        inconclusive_from(exc, "mapping a BAR")
        return None
    try:  # both views released before the mapping closes, whatever the copy raised
        with memoryview(mapped) as view, view[offset - page : offset - page + size] as wanted:
            return _copied_by_kernel(wanted)
    finally:
        mapped.close()


_MMIO_MAX_READ = 4096  # within PIPE_BUF: one write into an empty pipe takes it whole


def _copied_by_kernel(view: memoryview) -> bytes:
    """``view``'s bytes as the kernel reads them (write into a pipe, read back); b"" on EFAULT."""
    try:
        rfd, wfd = os.pipe()
    except OSError as exc:
        inconclusive_from(exc, "a pipe for a BAR read")
        raise
    try:
        try:
            written = os.write(wfd, view)
        except OSError as exc:
            if exc.errno == errno.EFAULT:
                return b""  # the mapping was revoked under the read
            raise
        return os.read(rfd, written)
    finally:
        os.close(rfd)
        os.close(wfd)
