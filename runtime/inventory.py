"""Per-device inventory records, fingerprints and the identity registry (DISC-01, DISC-05)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace

from .pciconfig import ConfigSpace, parse_config
from .sysfs import PCI_DEVICES, Sysfs

# resource-file flags (include/linux/ioport.h)
_IORESOURCE_IO = 0x100
_IORESOURCE_MEM = 0x200
_IORESOURCE_PREFETCH = 0x2000
_IORESOURCE_MEM_64 = 0x100000
_BASIS_RANK = {"location": 0, "serial": 1, "dsn": 2}


class DeviceGone(Exception):
    """The device vanished while it was being described."""


@dataclass
class DeviceInfo:
    """What the runtime knows of one PCI function.

    ``to_dict()`` writes IDs as lowercase hex without "0x", as ``lspci -n``
    does: 4 digits for vendor/device/subsystem ("10de"), 6 for the class
    ("010802"), 2 for the revision. ``config_present`` is False when config
    space reads all ones (fell off the bus, lost config): IDs then come from
    the kernel's cached sysfs attributes and capabilities are empty.
    ``identity_basis`` says what the fingerprint rests on: "dsn", "serial"
    or "location".
    """

    bdf: str
    vendor_id: int
    device_id: int
    subsystem_vendor_id: int | None
    subsystem_id: int | None
    class_code: int
    revision: int
    bars: list[dict] = field(default_factory=list)  # index, kind, prefetchable, size, address
    capabilities: dict = field(default_factory=dict)
    link: dict = field(default_factory=dict)  # cap_speed_gts, cap_width, speed_gts, width, active
    driver: str | None = None
    numa_node: int | None = None
    slot: str | None = None
    reset_methods: list[str] = field(default_factory=list)
    serial: str | None = None
    fingerprint: str = ""
    config_present: bool = True
    identity_basis: str = "location"
    config: ConfigSpace | None = field(default=None, repr=False, compare=False)

    @property
    def ids(self) -> str:
        """ "vvvv:dddd", the key of per-ID configuration."""
        return f"{self.vendor_id:04x}:{self.device_id:04x}"

    def to_dict(self) -> dict:
        out = asdict(replace(self, config=None))  # the parsed config is big and not reported
        out.pop("config")
        for key in ("vendor_id", "device_id", "subsystem_vendor_id", "subsystem_id"):
            if out[key] is not None:
                out[key] = f"{out[key]:04x}"
        out["class_code"] = f"{self.class_code:06x}"
        out["revision"] = f"{self.revision:02x}"
        return out


def describe(sysfs: Sysfs, bdf: str, previous: DeviceInfo | None = None) -> DeviceInfo:
    """Read one device into a DeviceInfo; raises DeviceGone if it vanished mid-read.

    When config space is lost (all ones) the DSN is unreadable, so the
    identity of ``previous`` (the last good record of this BDF) is kept.
    """
    try:
        raw = sysfs.read_config(bdf)
    except OSError as exc:
        if not sysfs.exists(bdf):
            raise DeviceGone(bdf) from exc
        raw = b""
    try:
        cfg = parse_config(raw)
    except ValueError:
        cfg = None
    present = cfg is not None and cfg.present
    if present:
        ids = (
            cfg.vendor_id,
            cfg.device_id,
            cfg.subsystem_vendor_id,
            cfg.subsystem_id,
            cfg.class_code,
            cfg.revision,
        )
    else:
        ids = _cached_ids(sysfs, bdf)
    info = DeviceInfo(
        bdf,
        *ids,
        bars=_bars(sysfs.resources(bdf)),
        capabilities=_capabilities(cfg if present else None, len(raw)),
        link=_link(cfg if present else None),
        driver=sysfs.driver(bdf),
        numa_node=sysfs.numa_node(bdf),
        slot=sysfs.slot_of(bdf),
        reset_methods=sysfs.reset_methods(bdf),
        serial=class_serial(sysfs, bdf),
        config_present=present,
        config=cfg,
    )
    if not sysfs.exists(bdf):
        raise DeviceGone(bdf)
    if not present and previous is not None and previous.bdf == bdf:
        info.identity_basis, info.fingerprint = previous.identity_basis, previous.fingerprint
        info.serial = info.serial or previous.serial
    else:
        info.identity_basis, info.fingerprint = _identity(info)
    return info


def _cached_ids(sysfs: Sysfs, bdf: str) -> tuple:
    """IDs the kernel cached at enumeration: still readable after config space is lost."""

    def hex_attr(name: str) -> int | None:
        text = sysfs.attr(bdf, name)
        try:
            return int(text, 16) if text else None
        except ValueError:
            return None

    vendor, device = hex_attr("vendor"), hex_attr("device")
    if vendor is None and device is None and not sysfs.exists(bdf):
        raise DeviceGone(bdf)
    return (
        vendor if vendor is not None else 0xFFFF,
        device if device is not None else 0xFFFF,
        hex_attr("subsystem_vendor"),
        hex_attr("subsystem_device"),
        hex_attr("class") or 0,
        hex_attr("revision") or 0,
    )


def _bars(resources: list[tuple[int, int, int]]) -> list[dict]:
    """BARs 0-5 that the kernel assigned, sizes from the ``resource`` file."""
    bars = []
    for index, (start, end, flags) in enumerate(resources[:6]):
        if not flags & (_IORESOURCE_IO | _IORESOURCE_MEM) or end <= start:
            continue
        kind = "io" if flags & _IORESOURCE_IO else "mem64" if flags & _IORESOURCE_MEM_64 else "mem32"
        bars.append(
            {
                "index": index,
                "kind": kind,
                "prefetchable": bool(flags & _IORESOURCE_PREFETCH),
                "size": end - start + 1,
                "address": start,
            }
        )
    return bars


def _capabilities(cfg: ConfigSpace | None, config_length: int) -> dict:
    pcie = cfg.pcie if cfg else None
    msi = cfg.msi if cfg else None
    msix = cfg.msix if cfg else None
    return {
        "pcie": pcie is not None,
        "pm": bool(cfg and cfg.pm),
        "msi": msi is not None,
        "msix": msix is not None,
        "aer": bool(cfg and cfg.aer),
        "flr": bool(cfg and cfg.flr),
        "dsn": cfg.dsn if cfg else None,
        "pcie_version": pcie.version if pcie else None,
        "port_type": pcie.port_type if pcie else None,
        "msi_enabled": bool(msi and msi.enabled),
        "msi_vectors": msi.vectors if msi else None,
        "msix_enabled": bool(msix and msix.enabled),
        "msix_table_size": msix.table_size if msix else None,
        "bus_master": bool(cfg and cfg.bus_master),
        "standard": [c.name for c in cfg.capabilities] if cfg else [],
        "extended": [c.name for c in cfg.extended_capabilities] if cfg else [],
        "config_length": config_length,
    }


def _link(cfg: ConfigSpace | None) -> dict:
    """Link view. ``active``: DLL Link Active where the port reports it (downstream
    ports), else "trained" (negotiated width > 0), the best an endpoint can say."""
    pcie = cfg.pcie if cfg else None
    if pcie is None or pcie.link_cap_width is None:
        return {}
    if pcie.dll_link_active_reporting:
        active = pcie.dll_link_active
    else:
        active = bool(pcie.link_status_width) and pcie.link_status_speed_gts is not None
    return {
        "cap_speed_gts": pcie.link_cap_speed_gts,
        "cap_width": pcie.link_cap_width,
        "speed_gts": pcie.link_status_speed_gts,
        "width": pcie.link_status_width,
        "active": active,
    }


def class_serial(sysfs: Sysfs, bdf: str) -> str | None:
    """A class-specific serial: nvme's (nvme/nvme*/serial, needs the driver bound), else None."""
    for path in sysfs.glob(*PCI_DEVICES, bdf, "nvme", "nvme*", "serial"):
        serial = sysfs.read_text(path)
        if serial and not serial.startswith("("):  # "(efault)": the controller is not identified yet
            return serial
    return None


def _identity(info: DeviceInfo) -> tuple[str, str]:
    ids = (
        f"{info.vendor_id:04x}:{info.device_id:04x}:"
        f"{info.subsystem_vendor_id or 0:04x}:{info.subsystem_id or 0:04x}"
    )
    dsn = info.capabilities.get("dsn")
    if dsn:
        basis, value = "dsn", dsn
    elif info.serial:
        basis, value = "serial", info.serial
    else:
        basis, value = "location", f"{info.slot or ''}@{info.bdf}"
    digest = hashlib.sha256(f"{ids}|{basis}={value}".encode()).hexdigest()[:16]
    return basis, digest


def fingerprint(info: DeviceInfo) -> str:
    """Short hex digest (16 digits) of the device's identity: vendor/device/subsystem
    IDs + the DSN, else the class serial (e.g. nvme), else physical slot + BDF.

    Stable across restarts and reboots (nothing time- or order-dependent goes
    in) and distinct for two devices of one model. A class serial needs the
    driver bound: describe the device again after ``bind`` to upgrade an
    early "location" identity (IdentityRegistry treats that as no change).
    """
    return _identity(info)[1]


def unique_fingerprints(infos: list[DeviceInfo]) -> None:
    """Make fingerprints distinct among devices present together: devices that
    share one (two nvme given the same serial) get their location mixed in."""
    by_fp: dict[str, list[DeviceInfo]] = {}
    for info in infos:
        by_fp.setdefault(info.fingerprint, []).append(info)
    for group in by_fp.values():
        if len(group) < 2:
            continue
        for info in group:
            where = f"{info.slot or ''}@{info.bdf}"
            info.fingerprint = hashlib.sha256(f"{info.fingerprint}|{where}".encode()).hexdigest()[:16]
            info.identity_basis += "+location"


class IdentityRegistry:
    """Remembers the identity seen at each location (slot, else BDF) to flag
    in-place identity changes (DISC-05). With ``path`` it persists as JSON so
    a change across a runtime restart or guest reboot is flagged too; a path
    that cannot be written is tolerated (``last_error`` says why).
    """

    def __init__(self, path: str | None = None):
        self.path = path
        self.last_error: str | None = None
        self._seen: dict[str, dict] = {}
        if path and os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
                if isinstance(data, dict):
                    self._seen = {k: v for k, v in data.items() if isinstance(v, dict)}
            except (OSError, ValueError) as exc:
                self.last_error = f"cannot load {path}: {exc}"

    @staticmethod
    def location(info: DeviceInfo) -> str:
        """ "slot:N" when the device sits in a physical slot, else "bdf:BDF"."""
        return f"slot:{info.slot}" if info.slot else f"bdf:{info.bdf}"

    def observe(self, info: DeviceInfo) -> bool:
        """Record ``info``; True when a different identity was seen at its location before.

        A change: other IDs, or another DSN/serial, at the location. Not a
        change: the first sighting, a device whose config is lost (its DSN is
        unreadable), a stronger/weaker basis for the same IDs (an nvme serial
        that appears once the driver binds), or a device without DSN/serial
        whose BDF moved within its slot.
        """
        if not info.config_present:
            return False
        key = self.location(info)
        new = {
            "fingerprint": info.fingerprint,
            "basis": info.identity_basis,
            "ids": _full_ids(info),
        }
        old = self._seen.get(key)
        if old is None:
            self._record(key, new)
            return False
        old_rank = _BASIS_RANK.get(str(old.get("basis")).split("+")[0], 0)
        new_rank = _BASIS_RANK.get(new["basis"].split("+")[0], 0)
        if old.get("ids") != new["ids"]:
            changed = True
        elif old.get("basis") == new["basis"]:
            # two location identities differ only by bus numbering: no evidence of another device
            changed = new_rank > 0 and old.get("fingerprint") != new["fingerprint"]
        else:
            changed = False
        if changed or old.get("basis") == new["basis"] or new_rank > old_rank:
            self._record(key, new)
        return changed

    def _record(self, key: str, entry: dict) -> None:
        if self._seen.get(key) != entry:
            self._seen[key] = entry
            self._save()

    def _save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self._seen, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            self.last_error = None
        except OSError as exc:
            self.last_error = f"cannot save {self.path}: {exc}"


def _full_ids(info: DeviceInfo) -> str:
    return (
        f"{info.vendor_id:04x}:{info.device_id:04x}:"
        f"{info.subsystem_vendor_id or 0:04x}:{info.subsystem_id or 0:04x}"
    )
