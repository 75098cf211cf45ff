"""hilconform as a team installs it (issue 34), outside this checkout.

A wheel is built from the checkout and installed into a fresh virtualenv in an empty folder
under /tmp; from there, with no file of the checkout on any path:
* the CI job's commands of docs/ci.md (the block after `<!-- ci-commands -->`, run as written):
  install, `hilconform setup`, certify emulated:a100-stock's DISC-01 and emulated:a100's DP-02
  with the frozen test plugin; both CONFORMANT, run folders under the folder's reports/;
* `pytest --host emulated:a100-stock` on examples/vendor-tests (a vendor's own repository: the
  plugin through its pytest11 entry point, the vendor's own clauses and budgets): 2 passed;
* `hilconform doctor` with an empty cache says the guest image is missing and where it goes.

`hilconform setup` is given the checkout's built image and QEMU prefix (HILCONFORM_BUILD_DIR):
building them again into a cache of its own is the same recipe, timed in the README.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_DOC = ROOT / "docs" / "ci.md"
RUN_DEADLINE_S = 1200


def ci_commands(doc: Path = CI_DOC) -> str:
    """The shell block docs/ci.md marks as the CI job's commands."""
    text = doc.read_text()
    found = re.search(r"<!-- ci-commands -->\s*```sh\n(.*?)```", text, re.S)
    assert found, f"{doc}: no ```sh block after <!-- ci-commands -->"
    return found.group(1)


def outside_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points into the checkout or its venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("PYTEST_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    return {**env, **extra}


@pytest.fixture(scope="module")
def team_folder(tmp_path_factory, pciwatch) -> dict:
    """An empty folder outside the checkout, the wheel, and the CI commands' run there."""
    folder = tmp_path_factory.mktemp("team-repo")
    assert not folder.resolve().is_relative_to(ROOT)
    wheels = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = wheels.glob("hilconform-*.whl")
    env = outside_env(HILCONFORM_WHEEL=str(wheel), PLUGIN=str(pciwatch["frozen"]),
                      HILCONFORM_BUILD_DIR=str(ROOT / "vm-images" / "build"))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", ci_commands()], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=RUN_DEADLINE_S)
    return {"folder": folder, "wheel": wheel, "env": env, "ci": done,
            "venv": folder / ".hilconform-venv"}


def _certificates(folder: Path) -> dict[str, dict]:
    found = {}
    for path in sorted((folder / "reports").glob("*/certificate.json")):
        cert = json.loads(path.read_text())
        found[cert["host"]["spec"]] = cert
    return found


def test_the_ci_commands_certify_from_a_fresh_virtualenv_outside_the_checkout(team_folder):
    done = team_folder["ci"]
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    venv = team_folder["venv"]
    where = "import hilconform.reports, pathlib; print(pathlib.Path(hilconform.reports.__file__))"
    installed = subprocess.run([str(venv / "bin" / "python"), "-c", where], capture_output=True, text=True,
                               env=team_folder["env"], check=True).stdout.strip()
    assert Path(installed).is_relative_to(venv), f"hilconform imported from {installed}, not its virtualenv"
    certs = _certificates(team_folder["folder"])
    assert set(certs) == {"emulated:a100-stock", "emulated:a100"}, done.stdout[-3000:]
    for spec, cert in certs.items():
        assert cert["verdict"] == "conformant", f"{spec}: {cert['verdict']}"
        assert cert["versions"]["hilconform_checkout"] is None  # an installed tool names no commit
    assert {c["id"]: c["verdict"] for c in certs["emulated:a100"]["clauses"]} == {"DP-02": "pass"}
    assert certs["emulated:a100"]["device_plugin"]["kind"] == "command"
    assert "hilconform setup: ready" in done.stdout


def test_a_vendors_own_tests_run_with_the_installed_plugin(team_folder, tmp_path):
    repo = tmp_path / "vendor-tests"
    shutil.copytree(ROOT / "examples" / "vendor-tests", repo)
    done = subprocess.run([str(team_folder["venv"] / "bin" / "pytest"), "--host", "emulated:a100-stock",
                           "-p", "no:cacheprovider"], cwd=repo, env=team_folder["env"],
                          capture_output=True, text=True, timeout=RUN_DEADLINE_S)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "2 passed" in done.stdout
    pytest_argv = [str(team_folder["venv"] / "bin" / "pytest"), "--list-clauses", "-p", "no:cacheprovider"]
    listed = subprocess.run(pytest_argv, cwd=repo, env=team_folder["env"], capture_output=True, text=True,
                            timeout=120)
    assert "clause ACME-01 test_acme_card.py::test_inventory_lists_every_card_with_its_config_space_ids" in (
        listed.stdout), listed.stdout + listed.stderr
    assert "clause ACME-02 test_acme_card.py::test_fingerprints_survive_a_runtime_restart" in listed.stdout


def test_doctor_names_what_an_empty_cache_lacks(team_folder, tmp_path):
    env = {k: v for k, v in team_folder["env"].items() if k != "HILCONFORM_BUILD_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = subprocess.run([str(team_folder["venv"] / "bin" / "hilconform"), "doctor"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert f"build folder {tmp_path / 'cache' / 'hilconform'}" in done.stdout
    assert "guest image: not built" in done.stdout
    assert not (tmp_path / "cache").exists()  # doctor changes nothing
