"""One rule for errors that describe the runtime, not the device it tried to read.

Why: a config read that fails with EMFILE says the runtime ran out of file
descriptors, not that the device lost its configuration. Counting such an
error as a device fault turned a client's connection flood into every
healthy device FAULTED. Every place that turns an OSError into a device
verdict asks :func:`is_own_resource_error` first; a check that meets one is
inconclusive (:class:`OwnResourcesShort`): logged, retried on the next poll, and
the device keeps its state.
"""

from __future__ import annotations

import errno
import logging
import threading
import time

# The runtime process (or the whole host) is out of file descriptors, memory or buffers.
OWN_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

_log = logging.getLogger("hilconform.runtime")


def is_own_resource_error(exc: BaseException) -> bool:
    """True when ``exc`` says the runtime lacks a resource (EMFILE, ENFILE, ENOMEM, ENOBUFS, MemoryError)."""
    if isinstance(exc, OwnResourcesShort | MemoryError):
        return True
    return isinstance(exc, OSError) and exc.errno in OWN_RESOURCE_ERRNOS


class OwnResourcesShort(Exception):
    """A device check could not run for want of the runtime's own resources.

    Not an OSError on purpose: the ``except OSError`` handlers that mean
    "the device is unreadable" must not catch it.
    """

    def __init__(self, what: str, cause: BaseException):
        super().__init__(f"{what}: {cause}")
        self.what = what
        self.cause = cause


def inconclusive_from(exc: BaseException, what: str) -> None:
    """Raise OwnResourcesShort (from ``exc``) when ``exc`` is an own-resource error; else return."""
    if isinstance(exc, OwnResourcesShort):
        raise exc
    if is_own_resource_error(exc):
        raise OwnResourcesShort(what, exc) from exc


class EpisodeLog:
    """Logs the first inconclusive check of an episode and the recovery, not every retry.

    Why: under fd exhaustion every poll of every device fails the same way; one
    line per episode says what happened without flooding the log.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._count = 0
        self.total = 0  # since start (stats)

    def inconclusive(self, exc: BaseException, where: str) -> None:
        with self._lock:
            self._count += 1
            self.total += 1
            first = self._since is None
            if first:
                self._since = time.monotonic()
        if first:
            _log.warning(
                f"{where}: check inconclusive, the runtime lacks its own resources ({exc}); "
                "devices keep their state, retried on the next poll"
            )

    def conclusive(self) -> None:
        with self._lock:
            since, count = self._since, self._count
            self._since, self._count = None, 0
        if since is not None:
            _log.warning(
                f"device checks conclusive again after {time.monotonic() - since:.1f} s "
                f"({count} inconclusive check(s))"
            )

    @property
    def count(self) -> int:
        with self._lock:
            return self._count
