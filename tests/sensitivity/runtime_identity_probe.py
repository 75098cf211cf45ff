"""pytest plugin for sensitivity runs: record which runtime answered each test.

Why: a mutant that "survives" because the guest quietly ran the reference runtime
(a typo in the module, an import error and a fallback) would make the table lie.
Each test gets a user property `runtime_identity`: the `mutant` its runtime's hello
named, or "reference" when the hello named none, for every host the test used whose
runtime client was connected; and `clause`, from its clause marker. The runner
(run_sensitivity.py) reads both from the JUnit XML, which takes the properties of the
item (pytest writes a testcase's properties from its last report, the teardown's).
Loaded with `-p runtime_identity_probe` (this folder on PYTHONPATH).
"""

from __future__ import annotations

import pytest

from hilconform.fixtures.host import EmulatedHost

PROPERTY = "runtime_identity"
HELLO_KEY = "mutant"  # tests/mutants/launch.py adds it to hello


def identities(item: pytest.Item) -> set[str]:
    """Identities of the runtimes the test's hosts are connected to (nothing is connected here)."""
    funcargs = getattr(item, "funcargs", {}) or {}
    hosts = [v for v in funcargs.values() if isinstance(v, EmulatedHost)]
    factory = funcargs.get("host_factory")
    hosts += [h for h in getattr(factory, "hosts", []) if isinstance(h, EmulatedHost)]
    found = set()
    for host in hosts:
        client = host._runtime
        hello = getattr(client, "hello", None) if client is not None else None
        if isinstance(hello, dict):
            found.add(str(hello.get(HELLO_KEY) or "reference"))
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    yield
    if call.when != "call":
        return
    marker = item.get_closest_marker("clause")
    if marker and marker.args:
        item.user_properties.append(("clause", str(marker.args[0])))
    for name in sorted(identities(item)):
        item.user_properties.append((PROPERTY, name))
