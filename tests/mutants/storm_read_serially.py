"""Mutant storm_read_serially, breaks DISC-04: each change is described before the next is read.

Plausible bug (the reference runtime's own, until issue 14): the udev reader thread calls the
change handler itself, so while it reads one device's config space the next uevents wait
in the socket, and the batch closes one window after its first change without looking at
what is waiting there: a storm of many devices is read hundreds of ms apart and split into
several batches, and its later devices are discovered late.
"""

from __future__ import annotations

import time

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

    def read_with_a_blind_close(self):
        while not self._stop.is_set():
            first = self._read(discovery._IDLE_POLL_S)
            if first is None:
                continue
            batch = [first]
            deadline_ns = first[0].received_ns + round(self.window_s * 1e9)
            while (left_ns := deadline_ns - time.monotonic_ns()) > 0:
                item = self._read(left_ns / 1e9)
                if item is not None:
                    batch.append(item)
            self._closed_batches.put(batch)  # the bug: what waits in the socket is left for later
        self._closed_batches.put(None)

    discovery.ChangeHandlers.submit = submit_on_the_reader
    discovery.DiscoveryWatcher._read_changes = read_with_a_blind_close


if __name__ == "__main__":
    launch("storm_read_serially", apply)
