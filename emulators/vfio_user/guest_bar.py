"""Guest-side BAR access through sysfs `resourceN`: the user-space driver path of real stacks.

Runs inside the guest (stdlib only), fed to `python3 -` over the guest agent:

    python3 - BDF read OFF [OFF ...]        one line per register: OFF VALUE (hex)
    python3 - BDF write OFF VALUE [...]     32-bit stores, in order
    python3 - BDF time OFF COUNT [BAR]      COUNT 32-bit loads of OFF in BAR (0); ns per load

Enables the device's memory decoding first (`enable`), maps BAR0 and uses
32-bit aligned loads and stores only (memoryview cast), as a driver would.
"""

import mmap
import os
import sys
import time


def bar_view(bdf: str, bar: int = 0, length: int = 4096):
    base = f"/sys/bus/pci/devices/{bdf}"
    with open(f"{base}/enable") as f:
        enabled = f.read().strip() != "0"
    if not enabled:  # a device with a driver bound is enabled already (and refuses the write)
        with open(f"{base}/enable", "w") as f:
            f.write("1")
    fd = os.open(f"{base}/resource{bar}", os.O_RDWR | os.O_SYNC)
    try:
        window = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return window, memoryview(window).cast("I")


def main(argv):
    bdf, action, *args = argv
    _window, regs = bar_view(bdf, int(args[2]) if action == "time" and len(args) > 2 else 0)
    if action == "read":
        for off in args:
            print(f"{off} {regs[int(off, 0) // 4]:#010x}")
    elif action == "write":
        for off, value in zip(args[::2], args[1::2], strict=True):
            regs[int(off, 0) // 4] = int(value, 0)
    elif action == "time":
        index, count = int(args[0], 0) // 4, int(args[1])
        start = time.perf_counter_ns()
        for _ in range(count):
            regs[index]
        print((time.perf_counter_ns() - start) / count)
    else:
        sys.exit(f"unknown action {action!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
