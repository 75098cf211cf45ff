"""`hilconform report diff`: changed verdicts and figures, and clear errors for what cannot be compared."""

from __future__ import annotations

import json

from recorded_runs import DISC01, recorded_run, set_outcome

from hilconform.reports import certify
from hilconform.reports.cli import main
from hilconform.reports.diff import diff_certificates


def _finished(tmp_path, name, edit=None):
    run = recorded_run(tmp_path, name)
    if edit:
        edit(run)
    certify.finish(run)
    return run


def _scale_cold_discovery(run, factor):
    for path in run.measurements_dir.glob("DISC-03-cold_discovery-*.json"):
        data = json.loads(path.read_text())
        for key in ("min", "median", "p95", "max"):
            data[key] *= factor
        data["values"] = [v * factor for v in data["values"]]
        path.write_text(json.dumps(data))


def test_same_run_twice_shows_no_change(tmp_path, capsys):
    a, b = _finished(tmp_path, "a"), _finished(tmp_path, "b")
    assert main(["report", "diff", str(a.path), str(b.path)]) == 0
    assert "no clause verdict or figure changed" in capsys.readouterr().out


def test_changed_verdicts_and_moved_figures_are_listed_with_both_values(tmp_path, capsys):
    a = _finished(tmp_path, "a")
    b = _finished(
        tmp_path,
        "b",
        lambda run: (set_outcome(run, DISC01, "failed", "vendor"), _scale_cold_discovery(run, 1.5)),
    )
    assert main(["report", "diff", str(a.path), str(b.path)]) == 0
    out = capsys.readouterr().out
    assert "verdict: conformant -> nonconformant" in out
    assert "clause DISC-01: pass -> fail" in out
    before = json.loads(a.certificate.read_text())
    median = next(f["median"] for f in before["clauses"][1]["figures"] if f["name"] == "cold_discovery")
    assert f"figure DISC-03 cold_discovery: median {median:g} -> {median * 1.5:g}" in out
    assert "cold_discovery_runtime_reported" not in out  # unchanged figures are not listed


def test_a_figure_within_the_threshold_is_not_a_change(tmp_path):
    a = json.loads(_finished(tmp_path, "a").certificate.read_text())
    b = json.loads(
        _finished(tmp_path, "b", lambda run: _scale_cold_discovery(run, 1.05)).certificate.read_text()
    )
    assert not diff_certificates(a, b).changed


def test_a_folder_that_is_not_a_run_folder_is_a_clear_error(tmp_path, capsys):
    a = _finished(tmp_path, "a")
    (tmp_path / "plain").mkdir()
    assert main(["report", "diff", str(a.path), str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err
    assert "plain: not a run folder (no run.json" in err
    assert main(["report", "diff", str(a.path), str(tmp_path / "missing")]) == 2
    assert "missing: not a folder" in capsys.readouterr().err


def test_runs_of_another_schema_version_are_refused(tmp_path, capsys):
    a = _finished(tmp_path, "a")
    b = _finished(tmp_path, "b")
    cert = json.loads(b.certificate.read_text())
    cert["schema_version"] = 99
    b.certificate.write_text(json.dumps(cert))
    assert main(["report", "diff", str(a.path), str(b.path)]) == 2
    assert "certificate schema version 99" in capsys.readouterr().err


def test_a_run_without_certificate_is_refused(tmp_path, capsys):
    a = _finished(tmp_path, "a")
    b = recorded_run(tmp_path, "b")
    assert main(["report", "diff", str(a.path), str(b.path)]) == 2
    assert "no certificate.json" in capsys.readouterr().err


def test_rebuild_remakes_the_certificate_and_a_crash_is_exit_2_never_1(tmp_path, capsys):
    run = recorded_run(tmp_path)
    assert main(["report", "rebuild", str(run.path)]) == 0
    assert json.loads(run.certificate.read_text())["verdict"] == "conformant" and run.html.is_file()
    run.run_json.write_text("{}")  # a run.json without its run id: the builder cannot work
    assert main(["report", "rebuild", str(run.path)]) == 2
    assert "internal error" in capsys.readouterr().err


def test_a_figure_measured_in_one_run_only_is_listed_with_its_values(tmp_path, capsys):
    def drop_cold_discovery(run):
        for path in run.measurements_dir.glob("DISC-03-cold_discovery-*.json"):
            path.unlink()

    a = _finished(tmp_path, "a")
    b = _finished(tmp_path, "b", drop_cold_discovery)
    assert main(["report", "diff", str(a.path), str(b.path)]) == 0
    out = capsys.readouterr().out
    figure = next(
        f
        for f in json.loads(a.certificate.read_text())["clauses"][1]["figures"]
        if f["name"] == "cold_discovery"
    )
    assert (
        f"figure DISC-03 cold_discovery: only in A (median {figure['median']:g}, p95 {figure['p95']:g} ms)"
        in out
    )
    assert "nan" not in out
