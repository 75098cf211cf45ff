"""Budgets: the vocabulary a host profile may use, and the named sets a profile starts from.

Every profile, emulated or real, judges the same clauses against the same budget names
(`budgets.toml`: unit and meaning of each). Most hosts of one kind share most figures, so
the figures live in named sets (`budget_sets.toml`); a profile's `[budgets]` table names
its set as `base` and sets only the budgets where its host differs. Both files and every
profile are read strictly: a budget name that is not in the vocabulary is refused with the
name it resembles, because a misspelt budget would otherwise leave the real one at its
set's figure without a word.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from .errors import ProfileError
from .toml_file import read_toml

BUDGETS_PATH = Path(__file__).with_name("budgets.toml")
BUDGET_SETS_PATH = Path(__file__).with_name("budget_sets.toml")
BASE_KEY = "base"
PROFILE_KINDS = ("emulated", "real")
_BUDGET_ENTRY_KEYS = {"unit", "meaning"}
_SET_KEYS = {"meaning", "default_for", "budgets"}


@cache
def known_budgets() -> dict[str, dict]:
    """Budget name -> {unit, meaning}: every budget a host profile may set."""
    table = read_toml(BUDGETS_PATH, ProfileError, "budget list")
    for name, entry in table["budgets"].items():
        unknown = set(entry) - _BUDGET_ENTRY_KEYS
        if unknown or not _BUDGET_ENTRY_KEYS <= set(entry):
            raise ProfileError(f"{BUDGETS_PATH}: budgets.{name} must have unit and meaning; unknown: "
                               f"{', '.join(sorted(unknown)) or 'none'}")
    return table["budgets"]


def unknown_budget(names) -> tuple[str, str] | None:
    """(key, problem) for the first budget name that no profile may set, or None when all are known."""
    known = known_budgets()
    name = next((n for n in sorted(names) if n not in known), None)
    if name is None:
        return None
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"budgets.{name}", f"unknown budget ({hint}known: {', '.join(sorted(known))})"


@cache
def budget_sets() -> dict[str, dict[str, Any]]:
    """Set name -> {meaning, default_for, budgets}: the figures profiles start from."""
    table = read_toml(BUDGET_SETS_PATH, ProfileError, "budget sets")
    unknown_top = sorted(set(table) - {"sets"})
    if unknown_top:
        raise ProfileError(f"{BUDGET_SETS_PATH}: unknown key {unknown_top[0]!r} (allowed: sets)")
    defaults: dict[str, str] = {}
    for name, entry in table.get("sets", {}).items():
        where = f"{BUDGET_SETS_PATH}: sets.{name}"
        if not isinstance(entry, dict) or set(entry) - _SET_KEYS or not {"meaning", "budgets"} <= set(entry):
            raise ProfileError(f"{where} must have meaning and budgets (and may have default_for); "
                               f"unknown: {', '.join(sorted(set(entry) - _SET_KEYS)) or 'none'}")
        kind = entry.get("default_for")
        if kind is not None:
            if kind not in PROFILE_KINDS or kind in defaults:
                raise ProfileError(f"{where}.default_for: {kind!r} must be one of {PROFILE_KINDS}, "
                                   "and each kind has at most one default set")
            defaults[kind] = name
        misspelt = unknown_budget(entry["budgets"])
        if misspelt:
            raise ProfileError(f"{where}: key {misspelt[0]!r}: {misspelt[1]}")
        entry["budgets"] = _numbers(entry["budgets"], lambda key, problem, where=where: ProfileError(
            f"{where}: key {key!r}: {problem}"))
    return table.get("sets", {})


def default_budget_set(kind: str) -> str | None:
    """The set a profile of `kind` ("emulated" or "real") starts from when it names no base."""
    return next((name for name, entry in budget_sets().items() if entry.get("default_for") == kind), None)


def resolve_budgets(table: dict[str, Any], kind: str,
                    fail: Callable[[str, str], Exception]) -> dict[str, float]:
    """A profile's `[budgets]` table resolved: its base set's figures, then its own.

    `fail(key, problem)` makes the error that names the profile's file; every key of the
    table is either `base` or a known budget with a number.
    """
    own = dict(table)
    base = own.pop(BASE_KEY, None)
    if base is None:
        base = default_budget_set(kind)
    elif not isinstance(base, str) or base not in budget_sets():
        known = ", ".join(sorted(budget_sets()))
        raise fail(f"budgets.{BASE_KEY}", f"{base!r} is not a budget set (known: {known}; "
                   f"emulators/budget_sets.toml)")
    misspelt = unknown_budget(own)
    if misspelt:
        raise fail(*misspelt)
    inherited = budget_sets()[base]["budgets"] if base else {}
    return {**inherited, **_numbers(own, fail)}


def _numbers(table: dict[str, Any], fail: Callable[[str, str], Exception]) -> dict[str, float]:
    """Each budget of `table` as a float; a value that is not a number raises fail(key, problem)."""
    values = {}
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail(f"budgets.{key}", f"must be a number, got {type(value).__name__}")
        values[key] = float(value)
    return values
