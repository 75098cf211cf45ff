#!/usr/bin/env python3
"""Build the guest image: Debian 12 kernel, a tiny initramfs and an ext4 root.

Output goes to vm-images/build/ (ignored by git), or HILCONFORM_BUILD_DIR (`hilconform setup`):
  vmlinux          the Debian 12 kernel (linux-image-amd64), uncompressed ELF: QEMU
                   boots it through its PVH entry, which saves ~2.5 s of xz
                   decompression under TCG (falls back to the bzImage, vmlinuz)
  initramfs.cpio   busybox + the modules needed to reach the root disk
  rootfs.ext4      the Debian root file system (debootstrap)
  stamp            hash of the recipe; the build is skipped when it matches

Standard library only, so it runs before the project's virtualenv exists.
Needs root (debootstrap) and: debootstrap, mkfs.ext4, cpio.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# emulators/build_folder.py decides where (HILCONFORM_BUILD_DIR; a checkout: vm-images/build).
BUILD = Path(os.environ.get("HILCONFORM_BUILD_DIR") or HERE / "build")
SUITE = "bookworm"
RECIPE_FILES = ["build_guest.py", "packages.txt", "initramfs-init.sh", "stage2-init.sh"]
# Modules the initramfs loads, in order, to reach an ext4 root on virtio-blk.
INITRAMFS_MODULES = ["virtio_pci", "virtio_blk", "crc32c_generic", "ext4"]
OUTPUTS = ["vmlinuz", "initramfs.cpio", "rootfs.ext4"]
XZ_MAGIC = b"\xfd7zXZ\x00"


def progress(step: str) -> None:
    print(f"[guest image] {step}", flush=True)


def recipe_hash() -> str:
    digest = hashlib.sha256()
    for name in RECIPE_FILES:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return digest.hexdigest()


def up_to_date() -> bool:
    stamp = BUILD / "stamp"
    return (
        stamp.exists()
        and stamp.read_text().strip() == recipe_hash()
        and all((BUILD / name).exists() for name in OUTPUTS)
    )


def packages() -> list[str]:
    lines = (HERE / "packages.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def debian_mirror() -> str:
    """The Debian mirror this host's apt already uses (HILCONFORM_DEBIAN_MIRROR overrides)."""
    if os.environ.get("HILCONFORM_DEBIAN_MIRROR"):
        return os.environ["HILCONFORM_DEBIAN_MIRROR"]
    out = subprocess.run(
        ["apt-cache", "policy"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        match = re.search(r"(https?://\S+/debian)/?\s+\S+/main\s", line)
        if match and "security" not in line:
            return match.group(1)
    sys.exit(
        "guest image: cannot find a Debian mirror in `apt-cache policy`; "
        "set HILCONFORM_DEBIAN_MIRROR=<mirror URL>"
    )


def run(argv: list[str], **kwargs) -> None:
    subprocess.run(argv, check=True, **kwargs)


def check_tools() -> None:
    if os.geteuid() != 0:
        sys.exit("guest image: building needs root (debootstrap). Run: sudo make image")
    missing = [t for t in ("debootstrap", "mkfs.ext4", "cpio") if not shutil.which(t)]
    if missing:
        sys.exit(
            f"guest image: missing {', '.join(missing)}. "
            "Run: apt-get install debootstrap e2fsprogs cpio"
        )


def debootstrap(root: Path) -> None:
    progress(f"debootstrap {SUITE} with {len(packages())} packages (about 1-2 minutes)")
    argv = [
        "debootstrap", "--variant=minbase", f"--include={','.join(packages())}",
        SUITE, str(root), debian_mirror(),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        match = re.match(r"I: (Retrieving|Unpacking|Configuring) ", line)
        if match and match.group(1) not in seen:
            seen.add(match.group(1))
            progress(f"  debootstrap: {match.group(1).lower()} packages")
    if proc.wait() != 0:
        sys.stderr.write("".join(tail))
        sys.exit(f"guest image: debootstrap failed (status {proc.returncode})")


def customise(root: Path) -> None:
    progress("customising the root file system")
    for junk in ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info",
                 "var/cache/apt", "var/lib/apt/lists", "boot/initrd.img"):
        for path in root.glob(junk + "*"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    shutil.copy(HERE / "stage2-init.sh", root / "sbin/hilconform-init")
    (root / "sbin/hilconform-init").chmod(0o755)
    (root / "etc/hostname").write_text("hilconform-guest\n")
    (root / "etc/fstab").write_text("# mounts are made by /sbin/hilconform-init\n")


def kernel_version(root: Path) -> str:
    versions = sorted(p.name for p in (root / "lib/modules").iterdir())
    if not versions:
        sys.exit("guest image: no kernel modules in the root file system")
    return versions[-1]


def module_closure(moddir: Path, wanted: list[str]) -> list[str]:
    """Module paths (relative to moddir) in load order, dependencies first."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[Path(path).name.split(".ko")[0].replace("-", "_")] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name not in by_name:
            sys.exit(f"guest image: kernel module {name} not found in {moddir}")
        visit(by_name[name])
    return order


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    """Unpack the ELF kernel from an xz-compressed bzImage, if it is one."""
    data = bzimage.read_bytes()
    offset = data.find(XZ_MAGIC)
    if offset < 0:
        progress("kernel is not xz-compressed; QEMU will boot the bzImage")
        return
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[offset:])
    if elf[:4] != b"\x7fELF":
        progress("no ELF kernel inside the bzImage; QEMU will boot the bzImage")
        return
    out.write_bytes(elf)
    progress(f"extracted the uncompressed kernel ({len(elf) >> 20} MiB) for PVH boot")


def build_initramfs(root: Path, out: Path) -> None:
    progress("building the initramfs (busybox + virtio/ext4 modules)")
    staging = BUILD / "initramfs.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    for sub in ("bin", "proc", "sys", "dev", "newroot", "modules"):
        (staging / sub).mkdir(parents=True)
    shutil.copy(root / "bin/busybox", staging / "bin/busybox")
    shutil.copy(HERE / "initramfs-init.sh", staging / "init")
    (staging / "init").chmod(0o755)
    moddir = root / "lib/modules" / kernel_version(root)
    names = []
    for rel in module_closure(moddir, INITRAMFS_MODULES):
        name = Path(rel).name
        shutil.copy(moddir / rel, staging / "modules" / name)
        names.append(name)
    (staging / "modules/order").write_text("\n".join(names) + "\n")
    files = subprocess.run(
        ["find", "."], cwd=staging, capture_output=True, check=True
    ).stdout
    with open(out, "wb") as fh:
        run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=staging, input=files, stdout=fh)
    shutil.rmtree(staging)


def build_rootfs_image(root: Path, out: Path) -> None:
    used_mib = int(subprocess.run(
        ["du", "-sm", str(root)], capture_output=True, text=True, check=True
    ).stdout.split()[0])
    size_mib = int(used_mib * 1.3) + 128
    progress(f"writing rootfs.ext4 ({used_mib} MiB used, {size_mib} MiB image)")
    out.unlink(missing_ok=True)
    run(["mkfs.ext4", "-q", "-F", "-L", "hilconform", "-d", str(root), str(out), f"{size_mib}M"])


def build() -> None:
    check_tools()
    started = time.monotonic()
    BUILD.mkdir(exist_ok=True)
    (BUILD / "stamp").unlink(missing_ok=True)
    root = BUILD / "rootfs.tmp"
    if root.exists():
        shutil.rmtree(root)
    debootstrap(root)
    customise(root)
    version = kernel_version(root)
    shutil.copy(root / f"boot/vmlinuz-{version}", BUILD / "vmlinuz")
    (BUILD / "kernel-version").write_text(version + "\n")
    (BUILD / "vmlinux").unlink(missing_ok=True)
    extract_vmlinux(BUILD / "vmlinuz", BUILD / "vmlinux")
    build_initramfs(root, BUILD / "initramfs.cpio")
    build_rootfs_image(root, BUILD / "rootfs.ext4")
    shutil.rmtree(root)
    (BUILD / "stamp").write_text(recipe_hash() + "\n")
    progress(f"done in {time.monotonic() - started:.0f} s: {BUILD}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if the image is up to date, 1 if not; build nothing")
    args = parser.parse_args()
    if args.check:
        sys.exit(0 if up_to_date() else 1)
    if up_to_date() and not args.force:
        progress(f"up to date ({BUILD})")
        return
    build()


if __name__ == "__main__":
    main()
