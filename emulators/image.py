"""Where the guest image lives, and a clear error when it is not built."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .build_folder import PACKAGE_ROOT, build_folder, setup_hint
from .errors import ImageMissing

CHECKOUT = PACKAGE_ROOT  # what the guest's code share holds (emulators/qemu_command.py)


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initramfs: Path
    rootfs: Path
    kernel_version: str

    @classmethod
    def locate(cls, folder: Path | None = None) -> GuestImage:
        folder = Path(folder or os.environ.get("HILCONFORM_IMAGE_DIR") or build_folder())
        parts = {"kernel": "vmlinuz", "initramfs": "initramfs.cpio", "rootfs": "rootfs.ext4"}
        missing = [name for name in parts.values() if not (folder / name).exists()]
        if missing:
            raise ImageMissing(
                f"guest image incomplete in {folder} (missing {', '.join(missing)}); "
                f"build it with {setup_hint('image')}"
            )
        version_file = folder / "kernel-version"
        version = version_file.read_text().strip() if version_file.exists() else "unknown"
        paths = {k: folder / v for k, v in parts.items()}
        if (folder / "vmlinux").exists():  # uncompressed: boots ~2.5 s faster under TCG
            paths["kernel"] = folder / "vmlinux"
        return cls(**paths, kernel_version=version)
