"""The health checkpoint reads the config header only (issue 17).

Why: the runtime checkpoints every idle device every `health_poll_ms` (RST-03), and each config
read is a bus transaction (on a device model, a vfio-user round trip to its server). Reading the
whole legacy space and the extended capabilities for the three things the checkpoint judges (IDs,
BARs, the MMIO probe) made an idle emulated host's runtime its guest's busiest process.
"""

from __future__ import annotations

from fakesysfs import FakeSysfs, mem_bar, nvme_config

from hilconform.runtime import procedures
from hilconform.runtime.inventory import describe
from hilconform.runtime.sysfs import Sysfs

NVME = "0000:01:00.0"


class HeaderOnlySysfs(Sysfs):
    """A sysfs where reading past the 64-byte header fails the test."""

    def read_config(self, bdf: str, full: bool = False) -> bytes:
        raise AssertionError(f"the checkpoint read {bdf}'s config past its header")


def test_the_checkpoint_judges_from_the_header_alone(tmp_path):
    fake = FakeSysfs(tmp_path)
    fake.add_device(NVME, nvme_config(), resource=[mem_bar(0xFE000000, 0x4000)])
    info = describe(fake.sysfs, NVME)
    sysfs = HeaderOnlySysfs(str(fake.root))
    intact = {"name": "config_intact", "ok": True, "problems": []}
    assert procedures.config_intact(sysfs, NVME, info) == intact

    cleared = bytearray(nvme_config())
    cleared[0x10:0x18] = bytes(8)  # BAR0 (64-bit) cleared behind the driver
    fake.set_config(NVME, bytes(cleared))
    checkpoint = procedures.config_intact(sysfs, NVME, info)
    assert not checkpoint["ok"] and "BAR0 cleared" in checkpoint["problems"]

    fake.set_config(NVME, b"\xff" * 4096)
    checkpoint = procedures.config_intact(sysfs, NVME, info)
    assert not checkpoint["ok"] and "config space reads all ones" in checkpoint["problems"]
