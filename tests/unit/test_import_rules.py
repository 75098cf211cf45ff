"""Which piece may import which (docs/architecture.md), checked on every .py file with `ast`.

The runtime must run alone in the guest and on a lab host; the emulators are a library
usable without pytest; suites reach the test bed only through the plugin (and the
runtime's protocol module); reports read what a run wrote. An import that breaks one of
these rules is named with its file, line and module. Imports inside functions count too
(`ast.walk` sees every statement), so a rule cannot be dodged by importing late.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".venv", "build", "__pycache__", "node_modules"}
SUITES_MAY_IMPORT = ("hilconform.fixtures", "hilconform.runtime.protocol")


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # absolute: "hilconform.emulators.errors", or a bare top-level name

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: imports {self.module}"


@cache
def package_dirs() -> dict[Path, str]:
    """Top-level folder -> import name, as pyproject's package-dir maps them."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {ROOT / folder: name for name, folder in table.items()}


def module_name(path: Path) -> tuple[str, bool]:
    """The import name of a file and whether it is a package's __init__; bare stem outside packages."""
    for folder, name in package_dirs().items():
        if path.is_relative_to(folder):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                return ".".join(parts[:-1]), True
            return ".".join(parts), False
    return path.stem, False


@cache
def project_modules() -> frozenset[str]:
    """Every module name the project's own files define (for `from pkg import module`)."""
    return frozenset(module_name(p)[0] for p in python_files())


def python_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not any(part in SKIPPED_DIRS or part.startswith(".") for part in p.relative_to(ROOT).parts[:-1])
    )


def imports_in(source: str, module: str, is_package: bool, path: Path = ROOT) -> list[Import]:
    """Every module the source imports, anywhere in it, as absolute names.

    `from pkg import name` counts as importing pkg.name when that is one of the project's
    modules, else pkg; relative imports are resolved against `module`.
    """
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = resolve_relative(package, node.level, base)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.append(Import(path, node.lineno, child if child in project_modules() else base))
    return found


def resolve_relative(package: str, level: int, name: str) -> str:
    """`from ..name import` inside `package`, made absolute; left relative ("..name") if it escapes."""
    parts = package.split(".") if package else []
    if level - 1 >= len(parts):
        return "." * level + name
    anchor = parts[: len(parts) - (level - 1)]
    return ".".join([*anchor, name] if name else anchor)


@cache
def all_imports() -> tuple[Import, ...]:
    out: list[Import] = []
    for path in python_files():
        module, is_package = module_name(path)
        out += imports_in(path.read_text(), module, is_package, path)
    return tuple(out)


def imports_under(folder: str) -> list[Import]:
    return [i for i in all_imports() if i.path.is_relative_to(ROOT / folder)]


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@cache
def bare_project_names(folder: str) -> frozenset[str]:
    """Names that import a file of `folder` by its bare name (support modules put on sys.path)."""
    return frozenset(p.stem for p in python_files() if p.is_relative_to(ROOT / folder)) | {folder}


def is_project(module: str) -> bool:
    """Whether the module is one of the project's (by any name it could be imported under)."""
    top = module.split(".")[0]
    folders = {folder.name for folder in package_dirs()}
    return (
        module.startswith(".")
        or top == "hilconform"
        or top in folders
        or top in bare_project_names("suites")
        or top in bare_project_names("tests")
    )


def is_suite_or_test(module: str) -> bool:
    top = module.split(".")[0]
    return top in bare_project_names("suites") or top in bare_project_names("tests")


def report(bad: list[Import], rule: str) -> None:
    if bad:
        pytest.fail(f"{rule}:\n  " + "\n  ".join(map(str, dict.fromkeys(bad))), pytrace=False)


# -- the rules ------------------------------------------------------------------------------------


def test_runtime_imports_nothing_of_the_project_but_itself():
    bad = [
        i
        for i in imports_under("runtime")
        if is_project(i.module) and not within(i.module, "hilconform.runtime")
    ]
    report(bad, "runtime/ imports only hilconform.runtime.* of the project (it runs alone in the guest)")


def test_emulators_never_import_the_plugin_suites_reports_or_tests():
    forbidden = ("hilconform.fixtures", "hilconform.reports")
    bad = [
        i for i in imports_under("emulators") if within(i.module, *forbidden) or is_suite_or_test(i.module)
    ]
    report(
        bad, "emulators/ is a library usable without pytest: no hilconform.fixtures, suites, reports or tests"
    )


def test_suites_import_only_the_plugin_the_protocol_and_their_own_support_modules():
    """A suite's own support modules are imported by bare name: suites/<area>/ has no __init__.py,
    so pytest's default `prepend` import mode puts the test file's own folder (its basedir, the
    first folder up without __init__.py) first on sys.path before importing it."""
    bad = []
    for found in imports_under("suites"):
        sibling = (found.path.parent / f"{found.module.split('.')[0]}.py").is_file()
        if is_project(found.module) and not sibling and not within(found.module, *SUITES_MAY_IMPORT):
            bad.append(found)
    report(bad, f"suites/ import only {' and '.join(SUITES_MAY_IMPORT)} (and their own folder's modules)")


def test_suite_folders_are_not_packages():
    """The rule above relies on it: a folder with __init__.py would import support modules as
    `area.module`, and a bare name would no longer resolve to the sibling file."""
    assert not list((ROOT / "suites").rglob("__init__.py"))


def test_reports_never_import_the_emulators_tests_or_suites():
    bad = [
        i
        for i in imports_under("reports")
        if within(i.module, "hilconform.emulators") or is_suite_or_test(i.module)
    ]
    report(bad, "reports/ read what a run wrote: no hilconform.emulators, tests or suites")


def test_the_emulators_import_graph_has_no_cycle():
    edges: dict[str, set[str]] = {}
    for found in imports_under("emulators"):
        if within(found.module, "hilconform.emulators"):
            edges.setdefault(module_name(found.path)[0], set()).add(found.module)
    cycle = find_cycle(edges)
    assert cycle is None, "emulators/ import circle: " + " -> ".join(cycle)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph (its modules, the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for target in sorted(edges.get(node, ())):
            cycle = visit(target, [*path, node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(edges):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


# -- the checker itself ---------------------------------------------------------------------------


def test_imports_inside_functions_count():
    source = "def f():\n    from hilconform.emulators.errors import InfrastructureError\n"
    assert [(i.line, i.module) for i in imports_in(source, "x", False)] == [
        (2, "hilconform.emulators.errors")
    ]


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("from .errors import X", "hilconform.emulators.hotplug", False, "hilconform.emulators.errors"),
        (
            "from ..hotplug import X",
            "hilconform.emulators.vfio_user.hot_add",
            False,
            "hilconform.emulators.hotplug",
        ),
        ("from . import hotplug", "hilconform.emulators", True, "hilconform.emulators.hotplug"),
        ("from hilconform.runtime import protocol", "x", False, "hilconform.runtime.protocol"),
        ("from ...x import y", "hilconform.runtime", True, "...x"),
        (
            "from hilconform.emulators.errors import InfrastructureError",
            "x",
            False,
            "hilconform.emulators.errors",
        ),
    ],
)
def test_imports_resolve_to_absolute_modules(source, module, is_package, expected):
    assert [i.module for i in imports_in(source, module, is_package)] == [expected]


def test_a_cycle_is_found_and_named():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
