"""What runs on the node imports only what the node has: the standard library and grpcio.

runtime/deviceplugin/ and emulators/kubelet_stand_in/ run inside the Debian 12 guest
(python3-grpcio 1.51, no protobuf runtime, no qemu.qmp, no pytest); the stand-in may use
the device-plugin API package and the runtime's protocol module (its JSON-lines reader; standard
library only), nothing else of the project.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NODE_PACKAGES = {
    "runtime/deviceplugin": ("hilconform.runtime.deviceplugin",),
    "emulators/kubelet_stand_in": (
        "hilconform.runtime.deviceplugin",
        "hilconform.runtime.protocol",
        "hilconform.emulators.kubelet_stand_in",
    ),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or ""))
    return found


@pytest.mark.parametrize("folder", sorted(NODE_PACKAGES))
def test_node_code_imports_only_the_standard_library_grpc_and_the_api(folder):
    allowed_project = NODE_PACKAGES[folder]
    bad = []
    for path in sorted((ROOT / folder).glob("*.py")):
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top == "grpc":
                continue
            if any(module == p or module.startswith(p + ".") for p in allowed_project):
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not bad, "imports the node does not have:\n" + "\n".join(bad)


def test_the_proto_ships_beside_the_codec():
    assert (ROOT / "runtime/deviceplugin/v1beta1.proto").is_file()
