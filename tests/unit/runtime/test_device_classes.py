"""Per-class hooks: queue probe, firmware version, interrupt readiness (HP-03, HP-05)."""

from __future__ import annotations

import pytest
from fakesysfs import ConfigBuilder, FakeSysfs, edu_config, mem_bar, nvme_config

from hilconform.runtime.device_classes import (
    BlockHooks,
    ClassHooks,
    NvidiaGpuHooks,
    NvmeHooks,
    hooks_for,
)
from hilconform.runtime.inventory import describe

NVME = "0000:01:00.0"


@pytest.fixture
def fake(tmp_path):
    return FakeSysfs(tmp_path)


def _nvme(fake, msix_enabled=False, **kwargs):
    fake.add_device(
        NVME,
        nvme_config(msix_enabled=msix_enabled),
        resource=[mem_bar(0xFE000000, 0x4000)],
        **kwargs,
    )
    return describe(fake.sysfs, NVME)


def test_nvme_queue_depth_sums_inflight(fake):
    info = _nvme(fake, driver="nvme", nvme_inflight=(0, 0), nvme_serial="S", nvme_firmware="1.0")
    hooks = hooks_for(info)
    assert isinstance(hooks, NvmeHooks) and hooks.name == "nvme"
    assert hooks.queue_depth(fake.sysfs, NVME) == 0
    fake.set_inflight(NVME, 1, 2)
    assert hooks.queue_depth(fake.sysfs, NVME) == 3


def test_a_process_holding_a_namespace_open_counts_in_the_queue(fake, tmp_path):
    """udev's blkid reads a new namespace block after block: between two reads nothing is in
    flight, yet the next read comes; its open file keeps the queue from reading empty."""
    info = _nvme(fake, driver="nvme", nvme_inflight=(0, 0), nvme_serial="S", nvme_firmware="1.0")
    hooks = hooks_for(info)
    controller = tmp_path / "sys" / "bus" / "pci" / "devices" / NVME / "nvme"
    namespace = next(controller.glob("nvme*/nvme*n*")).name
    fds = tmp_path / "proc" / "4242" / "fd"
    fds.mkdir(parents=True)
    (fds / "0").symlink_to("/dev/null")
    (tmp_path / "proc" / "self").mkdir()  # not a pid
    assert hooks.queue_depth(fake.sysfs, NVME) == 0
    (fds / "3").symlink_to(f"/dev/{namespace}")
    assert hooks.queue_depth(fake.sysfs, NVME) == 1
    (fds / "4").symlink_to(f"/dev/{namespace}p1")  # a partition of it
    (fds / "5").symlink_to(f"/dev/{namespace}0")  # another namespace (nvme0n10), not this one
    assert hooks.queue_depth(fake.sysfs, NVME) == 2
    fake.set_inflight(NVME, 1, 0)  # busy: the requests in flight, no scan of /proc
    assert hooks.queue_depth(fake.sysfs, NVME) == 1


def test_nvme_without_namespace_has_empty_queue(fake):
    info = _nvme(fake)
    assert hooks_for(info).queue_depth(fake.sysfs, NVME) == 0


def test_nvme_firmware_from_sysfs_and_override(fake):
    info = _nvme(fake, driver="nvme", nvme_serial="S", nvme_firmware="7.2.22")
    assert hooks_for(info).firmware_version(fake.sysfs, NVME, info) == "7.2.22"
    override = hooks_for(info, {"firmware": {"1b36:0010": "1.0"}})
    assert override.firmware_version(fake.sysfs, NVME, info) == "1.0"
    other = hooks_for(info, {"firmware": {"1b36:0011": "9"}})
    assert other.firmware_version(fake.sysfs, NVME, info) == "7.2.22"


def test_generic_device_has_no_queue_probe_or_firmware(fake):
    b = ConfigBuilder(vendor=0x8086, device=0x10D3, class_code=0x020000)
    b.msix(5)
    fake.add_device("0000:02:00.0", b.build())
    info = describe(fake.sysfs, "0000:02:00.0")
    hooks = hooks_for(info)
    assert type(hooks) is ClassHooks and hooks.requires_driver
    assert hooks.queue_depth(fake.sysfs, info.bdf) is None
    assert hooks.firmware_version(fake.sysfs, info.bdf, info) is None
    assert hooks.interrupts_ready(fake.sysfs, info.bdf, info) is False


@pytest.mark.parametrize(
    "setup",
    ["driver", "msi_irqs", "msix_enabled"],
)
def test_interrupts_ready_signals(fake, setup):
    b = ConfigBuilder(vendor=0x8086, device=0x10D3, class_code=0x020000)
    b.msix(5, enabled=setup == "msix_enabled")
    fake.add_device(
        "0000:02:00.0",
        b.build(),
        driver="e1000e" if setup == "driver" else None,
        msi_irqs=(40,) if setup == "msi_irqs" else (),
    )
    info = describe(fake.sysfs, "0000:02:00.0")
    assert hooks_for(info).interrupts_ready(fake.sysfs, info.bdf, info) is True


def test_driverless_devices(fake):
    fake.add_device("0000:03:00.0", edu_config())
    edu = describe(fake.sysfs, "0000:03:00.0")
    hooks = hooks_for(edu)
    assert not hooks.requires_driver and hooks.interrupts_ready(fake.sysfs, edu.bdf, edu)
    info = _nvme(fake)
    assert hooks_for(info).interrupts_ready(fake.sysfs, NVME, info) is False
    relaxed = hooks_for(info, {"driverless": ["1B36:0010"]})
    assert relaxed.interrupts_ready(fake.sysfs, NVME, info) is True


def test_block_and_nvidia_classes(fake, tmp_path):
    fake.add_device("0000:04:00.0", ConfigBuilder(vendor=0x1AF4, device=0x1042, class_code=0x018000).build())
    blk = describe(fake.sysfs, "0000:04:00.0")
    assert isinstance(hooks_for(blk), BlockHooks)
    assert hooks_for(blk).queue_depth(fake.sysfs, blk.bdf) is None  # no block device below
    fake.add_device(
        "0000:05:00.0",
        ConfigBuilder(vendor=0x10DE, device=0x20B0, class_code=0x030200).build(),
        driver="nvidia",
    )
    gpu = describe(fake.sysfs, "0000:05:00.0")
    hooks = hooks_for(gpu)
    assert isinstance(hooks, NvidiaGpuHooks)
    proc = tmp_path / "proc/driver/nvidia/gpus/0000:05:00.0"
    proc.mkdir(parents=True)
    (proc / "information").write_text("Model: \t\t NVIDIA A100-SXM4-40GB\nVideo BIOS: \t 92.00.45.00.05\n")
    assert hooks.firmware_version(fake.sysfs, gpu.bdf, gpu) == "92.00.45.00.05"


def test_bad_config_names_the_key(fake):
    info = _nvme(fake)
    with pytest.raises(ValueError, match="'firmwares'"):
        hooks_for(info, {"firmwares": {}})
    with pytest.raises(ValueError, match="firmware"):
        hooks_for(info, {"firmware": ["1.0"]})


def test_an_nvme_controller_is_ready_only_once_live_and_its_serial_once_identified(fake, tmp_path):
    """Kernel 6.1 shows an nvme controller being set up as state "new"/"connecting" and its
    serial as "(efault)": the self-check waits for "live", and no serial is taken from it."""
    info = _nvme(fake, driver="nvme", nvme_serial="(efault)", nvme_firmware="1.0")
    assert info.serial is None and info.identity_basis == "location"
    ctrl = next((tmp_path / "sys" / "bus" / "pci" / "devices" / NVME / "nvme").glob("nvme*"))
    hooks = hooks_for(info)
    (ctrl / "state").write_text("connecting\n")
    assert hooks.interrupts_ready(fake.sysfs, NVME, info) is False
    (ctrl / "state").write_text("live\n")
    assert hooks.interrupts_ready(fake.sysfs, NVME, info) is True


def test_an_nvme_whose_driver_is_bound_but_has_no_controller_yet_is_not_ready(fake):
    """The kernel links the driver before it calls the driver's probe, which makes the
    controller: in between, no controller, no serial (a re-added unit read as serial None,
    seen on a100-stock's DISC-05, 2026-12-03)."""
    info = _nvme(fake, driver="nvme")
    assert hooks_for(info).interrupts_ready(fake.sysfs, NVME, info) is False
    fake.set_driver(NVME, "vfio-pci")  # another driver makes no nvme controller at all
    assert hooks_for(info).interrupts_ready(fake.sysfs, NVME, info) is True


def test_an_nvme_controller_is_ready_once_udev_finished_its_namespaces(fake, tmp_path):
    info = _nvme(fake, driver="nvme", nvme_inflight=(0, 0), nvme_serial="S", nvme_firmware="1.0")
    hooks = hooks_for(info)
    assert hooks.interrupts_ready(fake.sysfs, NVME, info) is True  # no udev on this node
    udev_data = tmp_path / "run" / "udev" / "data"
    udev_data.mkdir(parents=True)
    assert hooks.interrupts_ready(fake.sysfs, NVME, info) is False  # udev still probing nvme0n1
    (udev_data / "b259:0").write_text("")
    assert hooks.interrupts_ready(fake.sysfs, NVME, info) is True
