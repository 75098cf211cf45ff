"""Re-create the qemu72-seabios-*.bin dumps: QEMU device models' config space, no guest needed.

Starts q35 with the models behind pcie-root-ports, lets SeaBIOS program bus
numbers and BARs, then reads each function's 4 KiB over ECAM (0xb0000000)
through QEMU's qtest protocol on stdio. Usage: python3 qemu_dump.py OUTDIR
"""

import os
import subprocess
import sys
import time

ECAM = 0xB0000000
DEVICES = [
    "pcie-root-port,id=rp1,chassis=1,slot=1,bus=pcie.0,addr=0x10,x-speed=16,x-width=16",
    "nvme,serial=HILC-NVME-0001,bus=rp1,addr=0",
    "pcie-root-port,id=rp2,chassis=1,slot=2,bus=pcie.0,addr=0x11",
    "virtio-net-pci,aer=on,bus=rp2,addr=0",
    "pcie-root-port,id=rp3,chassis=1,slot=3,bus=pcie.0,addr=0x12",
    "e1000e,bus=rp3,addr=0",
    "pcie-root-port,id=rp4,chassis=1,slot=4,bus=pcie.0,addr=0x13",
    "edu,bus=rp4,addr=0",
    "pci-testdev,bus=pcie.0,addr=0x5",
]


def main(outdir: str) -> None:
    args = [
        "qemu-system-x86_64",
        "-machine",
        "q35",
        "-nodefaults",
        "-display",
        "none",
        "-qtest",
        "stdio",
    ]
    for dev in DEVICES:
        args += ["-device", dev]
    qemu = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )

    def cmd(line: str) -> str:
        qemu.stdin.write(line + "\n")
        qemu.stdin.flush()
        while True:
            out = qemu.stdout.readline()
            if not out:
                raise SystemExit("qemu exited")
            if out.startswith(("OK", "FAIL")):
                return out.strip()

    def ecam(bus: int, dev: int, fn: int, off: int = 0) -> int:
        return ECAM | bus << 20 | dev << 15 | fn << 12 | off

    def read_dword(bus: int, dev: int, fn: int, off: int) -> int:
        return int(cmd(f"readl {ecam(bus, dev, fn, off):#x}").split()[1], 16)

    try:
        time.sleep(3)  # SeaBIOS: PCIEXBAR, bus numbers, BARs
        bus = {dev: (read_dword(0, dev, 0, 0x18) >> 8) & 0xFF for dev in (0x10, 0x11, 0x12, 0x13)}
        targets = {
            "root-port-1b36-000c": (0, 0x10, 0),
            "nvme-1b36-0010": (bus[0x10], 0, 0),
            "virtio-net-aer-1af4-1041": (bus[0x11], 0, 0),
            "e1000e-8086-10d3": (bus[0x12], 0, 0),
            "edu-1234-11e8": (bus[0x13], 0, 0),
            "pci-testdev-1b36-0005": (0, 5, 0),
            "q35-host-bridge-8086-29c0": (0, 0, 0),
        }
        for name, (b, d, f) in targets.items():
            raw = b"".join(read_dword(b, d, f, off).to_bytes(4, "little") for off in range(0, 4096, 4))
            with open(os.path.join(outdir, f"qemu72-seabios-{name}.bin"), "wb") as out:
                out.write(raw)
    finally:
        qemu.kill()
        qemu.wait()


if __name__ == "__main__":
    main(sys.argv[1])
