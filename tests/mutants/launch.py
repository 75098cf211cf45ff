"""Start the reference runtime with one mutation applied: the entry point of every mutant.

Why here and not in runtime/: a mutant is a test fixture. It patches the reference
runtime's modules at start (never a switch in production code), makes `hello` name
the mutant (so a sensitivity run can prove the guest really ran it, not the
reference), then runs the runtime's normal main. The guest starts it as
`python3 -m hilconform.tests.mutants.<name> --config FILE` (pytest's --runtime-module).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

HELLO_KEY = "mutant"


def announce(name: str) -> None:
    """Add ``"mutant": name`` to every hello reply."""
    from hilconform.runtime import service

    original = service.Service._m_hello

    def hello(self, session, req):
        result = original(self, session, req)
        result[HELLO_KEY] = name
        return result

    service.Service._m_hello = hello


def launch(name: str, apply: Callable[[], None]) -> None:
    """Apply the mutation, announce it, run the reference runtime's main; never returns."""
    from hilconform.runtime.__main__ import main

    apply()
    announce(name)
    print(f"hilconform-mutant: running mutant {name!r}", file=sys.stderr, flush=True)
    sys.exit(main())
