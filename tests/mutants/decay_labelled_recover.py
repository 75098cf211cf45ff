"""Mutant decay_labelled_recover, breaks LIFE-01: a DEGRADED device heals on its own once its
error weight decays, and the move is labelled `recover`.

Plausible bug: the decay healing of heals_when_errors_decay, written through the runtime's
own recover path (the move and the cleared error weight of a successful `recover`), so its
cause reads `recover` and its table check passes, yet no recover operation ever ran: no
`recover` procedure run is open for the device. Only the LIFE-01 checker, which believes a
`recover` cause only inside such a run, can tell.
"""

from __future__ import annotations

from .heals_when_errors_decay import heal_on_decay
from .launch import launch


def apply() -> None:
    def heal(self, dev, evidence: dict) -> None:
        self._move_health(dev, "HEALTHY", "recover", {**evidence, "name": "recover"})
        dev.aer.clear()

    heal_on_decay(heal)


if __name__ == "__main__":
    launch("decay_labelled_recover", apply)
