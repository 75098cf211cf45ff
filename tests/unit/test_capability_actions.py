"""docs/capabilities.md's table of actions is the code's, and every capability a host can offer
with a protocol is served by a declared method (else `host.get` would find nobody)."""

from __future__ import annotations

from pathlib import Path

from hilconform.emulators.host_action import capabilities_served
from hilconform.fixtures.capabilities import known, vocabulary
from hilconform.fixtures.capability_actions import BACKENDS, BEGIN, END, actions_table, ever_offered, serving

DOC = Path(__file__).resolve().parents[2] / "docs" / "capabilities.md"


def test_the_docs_table_of_actions_is_the_codes():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC.name} has lost its actions markers"
    shown = text[text.index(BEGIN):text.index(END) + len(END)]
    assert shown == actions_table(), (
        f"{DOC.name} differs from the code's declarations: regenerate it with "
        "`python -m hilconform.fixtures.capability_actions`")


def test_every_declared_name_is_in_the_vocabulary():
    for classes in BACKENDS.values():
        for cls in classes:
            known(capabilities_served(cls), cls.__name__)  # CapabilityError naming the stray word


def test_every_capability_a_host_offers_with_a_protocol_has_a_method_serving_it():
    table = vocabulary()
    for kind, offered in ever_offered().items():
        unserved = [name for name in offered if table[name].protocol and not serving(name, BACKENDS[kind])]
        assert not unserved, f"{kind}: offers {unserved} but no method declares them"


def test_no_fault_family_overrides_another():
    """Which code a fault runs is found by reading its action, never by working out an MRO: the
    fault families of the emulated injector share no attribute names (issue 36: `stall_queue` was
    once two methods, the model's calling the nvme one through super())."""
    from collections import defaultdict

    from hilconform.emulators.faults import FaultInjector
    from hilconform.emulators.faults.base import FaultsBase

    families = [c for c in FaultInjector.__mro__ if c not in (FaultInjector, FaultsBase, object)]
    assert len(families) >= 5
    defined = defaultdict(list)
    for family in families:
        for name in vars(family):
            if not name.startswith("__"):
                defined[name].append(family.__name__)
    assert {name: where for name, where in defined.items() if len(where) > 1} == {}
