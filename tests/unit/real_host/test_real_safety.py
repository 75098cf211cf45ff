"""What a destructive run may touch, its journal, and the undo plan (fake host data, no host)."""

from __future__ import annotations

import json

import hilconform.fixtures.real_safety as real_safety
from hilconform.fixtures.real_safety import Journal, SafetyPolicy, restore
from hilconform.fixtures.remote_command import CommandResult

PROTECTED = {
    "0000:00:02.0": ["holds the file system mounted at /"],
    "0000:00:01.0": ["is above 0000:02:00.0, which carries this SSH session (eno1 10.1.2.3)"],
    "0000:02:00.0": ["carries this SSH session (eno1 10.1.2.3)"],
}
SELECTED = frozenset({"0000:17:00.0", "0000:31:00.0", "0000:02:00.1", "0000:00:02.0"})


def test_read_only_refuses_everything():
    policy = SafetyPolicy(False, SELECTED, PROTECTED)
    assert "read-only" in " ".join(policy.reasons_against("0000:17:00.0"))


def test_destructive_allows_only_selected_unprotected_devices():
    policy = SafetyPolicy(True, SELECTED, PROTECTED)
    assert policy.reasons_against("0000:17:00.0") == []
    assert "not a device the profile selects" in " ".join(policy.reasons_against("0000:99:00.0"))
    assert "mounted at /" in " ".join(policy.reasons_against("0000:00:02.0"))
    # another function of the NIC's slot shares its resets: protected too
    assert "SSH session" in " ".join(policy.reasons_against("0000:02:00.1"))
    assert policy.safe_targets() == ["0000:17:00.0", "0000:31:00.0"]


def test_journal_is_json_lines_and_plans_the_undo(tmp_path):
    journal = Journal(tmp_path / "j.jsonl")
    journal.record("remove", "0000:17:00.0", driver="nvidia")
    journal.record("rescan", "*")
    journal.record("slot-power-off", "0000:31:00.0", driver="nvidia", slot="5")
    journal.record("reset", "0000:17:00.0", driver="nvidia", via="runtime")
    journal.record("load-module", "aer_inject", module="aer_inject")
    lines = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert [e["action"] for e in lines] == ["remove", "rescan", "slot-power-off", "reset", "load-module"]
    plan = journal.undo_plan()
    assert plan["rescan"] == ["0000:17:00.0", "0000:31:00.0"]
    assert plan["bind"] == {"0000:17:00.0": "nvidia", "0000:31:00.0": "nvidia"}
    assert plan["slot_power"] == ["5"]
    assert plan["unload"] == ["aer_inject"]


def test_a_test_s_changes_are_put_back_once_and_not_again_at_the_end(tmp_path, monkeypatch):
    """A destructive DP test on a real host is put back at its end (HostFactory.fresh); the run's
    final restore must not undo those entries a second time (a module unloaded twice fails)."""
    journal = Journal(tmp_path / "j.jsonl")
    journal.record("reset", "0000:17:00.0", driver="nvidia")
    mark = journal.mark()
    journal.record("remove", "0000:31:00.0", driver="nvidia")
    journal.record("load-module", "aer_inject", module="aer_inject")
    assert journal.undo_plan(mark) == {"rescan": ["0000:31:00.0"], "bind": {"0000:31:00.0": "nvidia"},
                                       "slot_power": [], "unload": ["aer_inject"]}
    done = []

    class Runner:
        def shell(self, script, timeout_s=30):
            done.append(script)
            return CommandResult((), 0, "", "")

        def run(self, argv, timeout_s=30):
            done.append(" ".join(argv))
            return CommandResult((), 0, "", "")

    monkeypatch.setattr(real_safety, "wait_present", lambda *a, **k: True)
    monkeypatch.setattr(real_safety, "bound_driver", lambda runner, bdf: "nvidia")
    assert restore(Runner(), journal, since=mark) == []
    assert any("modprobe -r aer_inject" in d for d in done)
    assert journal.undo_plan() == {"rescan": [], "bind": {"0000:17:00.0": "nvidia"},
                                   "slot_power": [], "unload": []}
