"""Mutant ignores_failed_self_check, breaks LIFE-02 (and HP-05): a failing device joins the pool.

Plausible bug: the self-check runs and its steps are reported, but its verdict is not
acted on (an error path that logs and falls through), so a device with the wrong
firmware becomes HEALTHY and allocatable.
"""

from __future__ import annotations

from hilconform.runtime import procedures

from .launch import launch


def apply() -> None:
    original = procedures.self_check

    def self_check_verdict_ignored(host, run, info, hooks, on_firmware=None):
        original(host, run, info, hooks, on_firmware)
        return None, {}

    procedures.self_check = self_check_verdict_ignored


if __name__ == "__main__":
    launch("ignores_failed_self_check", apply)
