"""`certify --self-check`: the self-check's contract (`--full --out DIR`), its result in the
certificate and the HTML. A stand-in script plays the self-check here."""

from __future__ import annotations

import json
import sys

from recorded_runs import recorded_run

from hilconform.reports import certify

STAND_IN = """
import argparse, json, pathlib, sys
parser = argparse.ArgumentParser()
parser.add_argument("--full", action="store_true")
parser.add_argument("--out", required=True)
parser.add_argument("--host", required=True)
args = parser.parse_args()
out = pathlib.Path(args.out)
out.mkdir(parents=True)
mutants = [{"name": "wrong-vendor", "verdict": "survived"}]
(out / "sensitivity.json").write_text(json.dumps({"full": args.full, "host": args.host, "mutants": mutants}))
(out / "sensitivity.md").write_text("| mutant | verdict |\\n| wrong-vendor | survived |\\n")
sys.exit(1)
"""


def test_self_check_result_goes_into_the_certificate_and_the_page(tmp_path, monkeypatch):
    script = tmp_path / "self_check_stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(certify, "SELF_CHECK_COMMAND", (sys.executable, str(script)))
    run = recorded_run(tmp_path)
    result = certify._self_check(run, "emulated:t4", deadline_s=60)
    cert = certify.finish(run, result)
    stored = json.loads(run.certificate.read_text())["sensitivity"]
    assert stored == cert["sensitivity"]
    assert stored["command"][1:] == ["--full", "--out", str(run.sensitivity_dir), "--host", "emulated:t4"]
    assert stored["exit_code"] == 1 and stored["summary"] == "a mutant survived or the reference failed"
    assert stored["tables"]["sensitivity.json"]["mutants"][0]["verdict"] == "survived"
    assert cert["verdict"] == "conformant"  # the suites' sensitivity is no finding about the runtime
    page = run.html.read_text()
    assert "Suite sensitivity (self-check)" in page and "| wrong-vendor | survived |" in page


def test_the_self_check_is_run_as_a_module_not_a_path_into_tests():
    assert certify.SELF_CHECK_COMMAND[1:] == ("-m", "hilconform.reports.self_check")


def test_self_check_without_the_catalogue_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    from hilconform.reports.cli import main

    monkeypatch.setattr(certify, "MUTANT_CATALOGUE", tmp_path / "absent.toml")
    assert main(["certify", "--host", "emulated:a100", "--self-check", "--out", str(tmp_path / "runs")]) == 2
    assert "--self-check needs" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
