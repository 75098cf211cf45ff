"""Mutant dp_preferred_allocation_fails, breaks DP-09: GetPreferredAllocation is offered but fails.

Plausible bug: the plugin announces `get_preferred_allocation_available` and its handler raises
(an index out of range when fewer devices are free than it assumed): every pod asking for the
resource fails admission on that node.
"""

from __future__ import annotations

from hilconform.runtime.deviceplugin import front_end

from .launch import launch


def apply() -> None:
    def preferred_allocation_that_fails(self, request, context):
        context.abort(front_end.grpc.StatusCode.INTERNAL, "index out of range")

    front_end.Endpoint.GetPreferredAllocation = preferred_allocation_that_fails


if __name__ == "__main__":
    launch("dp_preferred_allocation_fails", apply)
