"""Mutant release_trusts_cache, breaks RST-03: the release checkpoint answers from the cached
record, not from the device, so a device that lost its configuration while held goes
RELEASED -> HEALTHY.

Plausible bug: the runtime already ran `config_intact` on the device when it granted the
lease (moments ago, for a short job) and "saves a bus round trip" at release by reusing
that result: the checkpoint the device carried into its lease. The move back is still the
release checkpoint's (cause `release_checkpoint:release:L3`, its table lets it take
RELEASED -> HEALTHY), so LIFE-01's cause rules see nothing wrong; only a device that loses
its configuration during a lease, then is released, shows the checkpoint never looked.
Everything else (the periodic poll, allocate's own checkpoint) still reads the device.
"""

from __future__ import annotations

from hilconform.runtime import service

from .launch import launch


def apply() -> None:
    end_allocation = service.Service._end_allocation
    release_checkpoint = service.Service._release_checkpoint

    def end_allocation_keeping_the_lease_checkpoint(self, dev, cause: str) -> None:
        # the checkpoint of the device's last health move: HEALTHY -> ALLOCATED's config_intact
        dev.lease_checkpoint = dev.last_checkpoint
        end_allocation(self, dev, cause)

    def release_checkpoint_from_cache(self, dev) -> None:
        cached = getattr(dev, "lease_checkpoint", None)
        if not (isinstance(cached, dict) and cached.get("name") == "config_intact"):
            return release_checkpoint(self, dev)
        with self._lock:  # the bug: the device is not read
            if self.devices.get(dev.bdf) is dev and dev.release_cause and dev.states.health == "RELEASED":
                self._finish_release(dev, dev.release_cause, dict(cached))

    service.Service._end_allocation = end_allocation_keeping_the_lease_checkpoint
    service.Service._release_checkpoint = release_checkpoint_from_cache


if __name__ == "__main__":
    launch("release_trusts_cache", apply)
