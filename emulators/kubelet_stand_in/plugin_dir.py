"""The plugin directory as the kubelet keeps it: created on start, emptied of sockets.

Why only sockets: the kubelet's device manager removes every unix socket it finds there
when it starts (plugins watch for their own socket's removal, or for a new
`kubelet.sock`, and register again) and leaves regular files and folders alone (its
checkpoint lives there, and so may other tools' files).
"""

from __future__ import annotations

import os
import stat


def prepare(directory: str) -> list[str]:
    """Create ``directory`` if needed, then remove the sockets in it; the names removed."""
    os.makedirs(directory, mode=0o750, exist_ok=True)
    return remove_sockets(directory)


def remove_sockets(directory: str) -> list[str]:
    """Unlink every socket (or link to one) directly in ``directory``; OSError names the ones
    that could not be removed after trying them all, as the kubelet aggregates its errors."""
    removed, failed = [], []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        try:
            is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
        except OSError:
            continue  # vanished, or a dangling link: the kubelet skips what it cannot stat
        if not is_socket:
            continue
        try:
            os.unlink(path)
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append(f"{name} ({exc.strerror})")
    if failed:
        raise OSError(f"cannot remove socket(s) in {directory}: {', '.join(failed)}")
    return removed
