"""Mutant storm_read_serially, breaks DISC-04: each change is described before the next is read.

Plausible bug (the reference runtime's own, until issue 14): the udev reader thread calls the
change handler itself, so while it reads one device's config space the next uevents wait
in the socket; a storm of many devices is read hundreds of ms apart, split into several
batches, and its later devices are discovered late.
"""

from __future__ import annotations

from hilconform.runtime import discovery

from .launch import launch


def apply() -> None:
    def submit_on_the_reader(self, change):
        handling = discovery._Handling(change)
        try:
            self._call(self._on_change, change)  # the bug: on the reader's own thread
        finally:
            handling.done.set()
        return handling

    discovery.ChangeHandlers.submit = submit_on_the_reader


if __name__ == "__main__":
    launch("storm_read_serially", apply)
