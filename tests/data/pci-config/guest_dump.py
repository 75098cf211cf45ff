"""Re-create the guest-*.bin dumps: config space as the emulated Debian 12 guest sees it.

Boots the project's emulated hosts (hilconform.emulators, QEMU q35 + the guest
image), waits until the drivers have bound, and reads each function's sysfs
``config`` (4 KiB, the guest agent runs as root) from inside the guest:

  a100 profile  nvme bound to the nvme driver (MSI-X on), an nvme hot-added
                into slot spare0 (after pciehp and the driver took it),
                the root port of a slot populated at boot (gpu0), of the
                hot-plugged slot spare0 (after the hot-add) and of the
                still-empty slot spare1, the q35 host bridge
  fpga profile  an edu device (no guest driver binds it)

For each dump it prints the guest's ``lspci -nn -vvv -s BDF`` (live, what
expected.toml is filled from) and ``lspci -F`` of the dumped bytes themselves
(so the reading is of exactly the bytes in the file). Both are the guest's
lspci (pciutils 3.9.0). Usage: .venv/bin/python guest_dump.py OUTDIR

Two runs gave byte-identical files (same image, QEMU 7.2.22, TCG, 1 vCPU);
a different guest kernel or QEMU may leave other command/MSI-X/slot bits.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hilconform.emulators import hotplug
from hilconform.emulators.profile import load_profile
from hilconform.emulators.vm import EmulatedVM

BOUND_TIMEOUT_S = 30.0


def sysfs(bdf: str) -> str:
    return f"/sys/bus/pci/devices/{bdf}"


def wait_nvme_live(vm, bdf: str) -> None:
    """Until the nvme driver has bound and the controller is live (queues, MSI-X set up)."""
    script = f"cat {sysfs(bdf)}/nvme/nvme*/state 2>/dev/null"
    deadline = time.monotonic() + BOUND_TIMEOUT_S
    while time.monotonic() < deadline:
        if vm.agent.shell(script, timeout_s=10).stdout.strip() == "live":
            time.sleep(0.5)  # let the driver finish its last config writes
            return
        time.sleep(0.2)
    raise SystemExit(f"{bdf}: nvme controller not live after {BOUND_TIMEOUT_S:.0f}s")


def as_lspci_x(raw: bytes, bdf: str = "00:00.0") -> str:
    """The bytes as `lspci -xxxx` text, which `lspci -F` reads back."""
    lines = [f"{bdf} x"]
    for off in range(0, len(raw), 16):
        lines.append(f"{off:03x}: " + " ".join(f"{b:02x}" for b in raw[off : off + 16]))
    return "\n".join(lines) + "\n"


def dump(vm, outdir: Path, name: str, bdf: str) -> None:
    raw = vm.agent.read_file(f"{sysfs(bdf)}/config")
    (outdir / f"guest-{name}.bin").write_bytes(raw)
    driver = vm.agent.shell(f"basename $(readlink {sysfs(bdf)}/driver) 2>/dev/null").stdout.strip()
    live = vm.agent.run(["lspci", "-nn", "-vvv", "-s", bdf], timeout_s=30).check().stdout
    exact = lspci_file(vm, raw)
    print(f"===== guest-{name}.bin  {vm.profile.name} {bdf}  {len(raw)} bytes  driver={driver or '-'}")
    print("--- lspci -nn -vvv -s (live, in the guest)")
    print(live.rstrip())
    print("--- lspci -F (the dumped bytes, in the guest)")
    print(exact.rstrip())
    print()


def lspci_file(vm, raw: bytes) -> str:
    """The guest's lspci reading exactly these bytes (lspci -F)."""
    vm.agent.run(["/bin/sh", "-c", "cat > /tmp/dump.txt"], stdin=as_lspci_x(raw).encode()).check()
    return vm.agent.run(["lspci", "-F", "/tmp/dump.txt", "-nn", "-vvv"], timeout_s=30).check().stdout


def main(outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    with EmulatedVM(load_profile("a100-stock")) as vm:
        # gpu0 on root port 00:10.0 -> bus 1; spare0 is 00:14.0, spare1 00:15.0
        wait_nvme_live(vm, "0000:01:00.0")
        dump(vm, outdir, "nvme-bound-1b36-0010", "0000:01:00.0")
        dump(vm, outdir, "root-port-populated-1b36-000c", "0000:00:10.0")
        dump(vm, outdir, "root-port-empty-1b36-000c", "0000:00:15.0")
        dump(vm, outdir, "q35-host-bridge-8086-29c0", "0000:00:00.0")
        added = hotplug.hot_add(vm, "spare0")
        wait_nvme_live(vm, added.bdf)
        dump(vm, outdir, "nvme-hotadded-1b36-0010", added.bdf)
        dump(vm, outdir, "root-port-hotadded-1b36-000c", "0000:00:14.0")
    with EmulatedVM(load_profile("fpga-stock")) as vm:
        dump(vm, outdir, "edu-1234-11e8", "0000:01:00.0")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
