"""A host's actions, each declared once, on the method that implements it.

    class AerFaults(FaultsBase):
        @action("aer-nonfatal")
        def aer_nonfatal(self, target, error="UNSUP", ...) -> FaultRecord: ...

`@action(capability, ...)` names the capabilities of the one vocabulary
(fixtures/capabilities.toml) the method serves, and runs each call inside an Allure step
titled with the call (`fault: aer_nonfatal('gpu0')`), as labgrid's `@step` marks a driver's
actions. Whatever lists a backend's actions reads them back from its class
(`declared_actions`, `capabilities_served`): which object `host.get` hands a capability to,
the check that a capability's protocol is implemented by actions declaring it, the list in
docs/capabilities.md. There is no hand-kept list of actions to drift from the code.

An undo (resume a queue, restore configuration) declares the capability it undoes; `@action()`
with no name is a step serving no capability (restore everything). `@query(...)` declares
what a capability offers without changing the host (the kubelet site, the resources served):
declared, never a step. Outside an Allure run (no `--alluredir`, or allure absent) a
step costs next to nothing.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
CAPABILITIES_ATTRIBUTE = "__hilconform_capabilities__"
_inside = threading.local()  # an action that calls another (a model's stall_queue, its stock one) is one step


def step(title: str) -> AbstractContextManager:
    """An Allure step when allure is importable, else a no-op context."""
    try:
        import allure
    except ImportError:
        return nullcontext()
    return allure.step(title)


def call_title(name: str, args: tuple, kwargs: dict) -> str:
    """How a step names a call: `fault: stall_queue('gpu0', resume_after_s=3)`."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"fault: {name}({', '.join(parts)})"


def action(*capabilities: str, step_each_call: bool = True) -> Callable[[F], F]:
    """Declare a method as the action serving `capabilities`, run as an Allure step."""

    def declare(method: F) -> F:
        if step_each_call:
            @functools.wraps(method)
            def stepped(self, *args, **kwargs):
                if getattr(_inside, "action", False):
                    return method(self, *args, **kwargs)
                _inside.action = True
                try:
                    with step(call_title(method.__name__, args, kwargs)):
                        return method(self, *args, **kwargs)
                finally:
                    _inside.action = False
            declared = stepped
        else:
            declared = method
        setattr(declared, CAPABILITIES_ATTRIBUTE, frozenset(capabilities))
        return declared  # type: ignore[return-value]

    return declare


def query(*capabilities: str) -> Callable[[F], F]:
    """Declare a method that serves `capabilities` without changing the host (never a step)."""
    return action(*capabilities, step_each_call=False)


@functools.cache
def declared_actions(cls: type) -> dict[str, frozenset[str]]:
    """Method name -> the capabilities it declares, for every action of `cls` (its bases too).
    A class's methods do not change while it runs: read once per class."""
    found = {}
    for name in dir(cls):
        member = getattr(cls, name, None)
        names = getattr(member, CAPABILITIES_ATTRIBUTE, None)
        if names is not None:
            found[name] = names
    return found


def capabilities_served(cls: type) -> frozenset[str]:
    """Every capability an action of `cls` declares."""
    return frozenset().union(*declared_actions(cls).values())
