"""What a hot-add and a removal report: records shared by every way of hot-plugging.

Stock stand-ins (hotplug.py) and device models (vfio_user/hot_add.py) both return a
`HotAdd`; keeping the records here lets hotplug.py hand models to vfio_user without
the two modules importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HotAdd:
    slot: str
    device_id: str
    bdf: str  # where the guest will find it
    returned_ns: int  # host monotonic time when device_add returned


@dataclass(frozen=True)
class Removal:
    device_id: str
    requested_ns: int
    deleted_ns: int  # DEVICE_DELETED as received on the host

    @property
    def duration_s(self) -> float:
        return (self.deleted_ns - self.requested_ns) / 1e9
