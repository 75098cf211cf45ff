"""Run folders for the report tests: a real recorded run (data/recorded-run, DISC-01 and DISC-03 passing on
emulated:a100) copied into a temporary folder, and edits that turn it into other kinds of run (e.g. one
whose DP tests certified a `--device-plugin` command)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hilconform.reports.run_folder import RunFolder

RECORDED = Path(__file__).with_name("data") / "recorded-run"
DISC01 = (
    "suites/discovery/test_disc01_boot_inventory.py::test_boot_inventory_matches_qemu_and_the_guest_kernel"
)
DISC03 = "suites/discovery/test_disc03_cold_discovery.py::test_cold_discovery_after_runtime_start"
PLUGIN_SHA256 = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"
COMMAND_PLUGIN = {  # what fixtures/device_plugin.py's PluginChoice.identity() gives for a --device-plugin
    "kind": "command",
    "command": "~/plugins/my-plugin --socket-dir /var/lib/kubelet/device-plugins",
    "path": "/home/lab/plugins/my-plugin",
    "sha256": PLUGIN_SHA256,
    "resources": [{"name": "example.com/gpu", "device_ids": ["10de:20b0"]}],
    "api_versions": ["v1beta1"],
}


def recorded_run(folder: Path, name: str = "run") -> RunFolder:
    target = folder / name
    shutil.copytree(RECORDED, target)
    return RunFolder.open(target)


def rewrite_progress(run: RunFolder, edit) -> None:
    """`edit(record)` returns the record to keep (changed or not), or None to drop it."""
    kept = [r for r in (edit(dict(r)) for r in run.progress_records()) if r is not None]
    run.progress.write_text("".join(json.dumps(r) + "\n" for r in kept))


def set_outcome(run: RunFolder, nodeid: str, outcome: str, message: str = "") -> None:
    def edit(record):
        if record.get("kind") == "test" and record["nodeid"] == nodeid:
            record.update(outcome=outcome, message=message)
        return record

    rewrite_progress(run, edit)


def update_run(run: RunFolder, **fields) -> None:
    meta = run.read_run()
    meta.update(fields)
    run.write_run(meta)


def record_device_plugin(run: RunFolder, worker: str = "gw0", **identity) -> None:
    """The run's DP tests on `worker` certified COMMAND_PLUGIN, with `identity`'s fields changed."""
    run.device_plugin_dir.mkdir(exist_ok=True)
    (run.device_plugin_dir / f"{worker}.json").write_text(json.dumps({**COMMAND_PLUGIN, **identity}))
