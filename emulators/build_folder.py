"""Where hilconform builds what a run needs but git does not hold: the guest image and the
private QEMU (vfio-user) prefix.

One answer for every reader (emulators/image.py, emulators/toolchain.py) and every writer
(vm-images/build_guest.py, vm-images/build_qemu_prefix.py, which take it as HILCONFORM_BUILD_DIR):
* HILCONFORM_BUILD_DIR when set;
* in a source checkout (PACKAGE_ROOT holds pyproject.toml): vm-images/build, as `make image` and
  `make qemu-prefix` build it;
* for an installed hilconform (`pip install`, then `hilconform setup`): the user's cache folder,
  `$XDG_CACHE_HOME/hilconform` (~/.cache/hilconform), shared by every project on the machine and
  rebuilt only when its recipe changes (each build's stamp holds its recipe's hash).
"""

from __future__ import annotations

import os
from pathlib import Path

# A checkout's root, or an installed distribution's site-packages/hilconform: both hold emulators/,
# fixtures/, runtime/, reports/, suites/, docs/ and vm-images/ (pyproject.toml's package-dir).
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
ENV = "HILCONFORM_BUILD_DIR"


def is_checkout() -> bool:
    """Whether hilconform runs from a source checkout (an editable install counts)."""
    return (PACKAGE_ROOT / "pyproject.toml").is_file()


def build_folder() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    if is_checkout():
        return PACKAGE_ROOT / "vm-images" / "build"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "hilconform"


def setup_hint(what: str) -> str:
    """How to build `what` (`image`, `qemu-prefix`) here: make in a checkout, else `hilconform setup`."""
    if is_checkout():
        return f"`make {what}` (as root)"
    return "`hilconform setup` (as root)"
