"""The fleet report of nightly lab runs: lab-run.json written and read strictly (and in step with its
schema), fleet.json's matrix, changed verdicts and trends built from real certificates, fleet.json read
back strictly, `hilconform lab report`'s exit codes, and fleet.html rendered by a real headless Chromium.

The nights are built in tmp_path from real certify run folders (data/fleet, see its README): the
previous night certified both hosts on an idle machine; in the newest night lab-a100-1 was certified
under load (DISC-02 failed, DISC-03 inconclusive) and lab-a100-2 was held by ci-b/bob.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from test_reports_html import _render_in_chromium

from hilconform.reports import cli, svg_plots
from hilconform.reports.certificate import validate
from hilconform.reports.fleet import BadFleet, build_fleet, read_fleet, write_fleet_report
from hilconform.reports.lab_night import (
    HOST_KEYS,
    NIGHT_FILE,
    NIGHT_KEYS,
    SCHEMA_FILE,
    STATUSES,
    BadNight,
    Night,
    NightHost,
    night_to_dict,
    read_night,
    write_night,
)
from hilconform.reports.verdicts import EXIT_CODES, OVERALL_VERDICTS

DATA = Path(__file__).with_name("data") / "fleet"
IDLE_A100 = "20261204-083611-emulated-a100"
IDLE_STOCK = "20261204-083837-emulated-a100-stock"
LOADED_A100 = "20261204-131106-emulated-a100"
PREVIOUS_STARTED = "2026-12-03T01:00:00Z"
NEWEST_STARTED = "2026-12-04T01:00:00Z"
HELD_REASON = "held by ci-b/bob"


def _certificate(source: str) -> dict:
    return json.loads((DATA / source / "certificate.json").read_text())


def _median(source: str, key: str) -> float:
    """A figure's median, read straight from a fixture certificate (not through the fleet code)."""
    return next(f["median"] for c in _certificate(source)["clauses"] for f in c["figures"] if f["key"] == key)


def make_night(folder: Path, started: str, hosts: list[tuple[str, str, str, str | None]]) -> Path:
    """A NIGHT_DIR as `hilconform lab run` leaves it: (place, status, reason, fixture run or None)."""
    records = []
    for place, status, reason, source in hosts:
        run_dir = verdict = exit_code = None
        if source is not None:
            run_dir = f"{place}/{source}"
            shutil.copytree(DATA / source, folder / run_dir)
            verdict = _certificate(source)["verdict"]
            exit_code = EXIT_CODES[verdict]
        records.append(NightHost(place, status, reason, run_dir, verdict, exit_code, started, started))
    night = Night(
        coordinator="127.0.0.1:20408", tags={"lab": "nightly"}, started=started, ended=started, hosts=records
    )
    write_night(folder, night)
    return folder


@pytest.fixture
def nights(tmp_path) -> tuple[Path, Path]:
    """(newest night, previous night)."""
    previous = make_night(
        tmp_path / "night-1203",
        PREVIOUS_STARTED,
        [("lab-a100-1", "certified", "", IDLE_A100), ("lab-a100-2", "certified", "", IDLE_STOCK)],
    )
    newest = make_night(
        tmp_path / "night-1204",
        NEWEST_STARTED,
        [("lab-a100-1", "certified", "", LOADED_A100), ("lab-a100-2", "held", HELD_REASON, None)],
    )
    return newest, previous


# -- the fixture data ------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [IDLE_A100, IDLE_STOCK, LOADED_A100])
def test_fixture_certificates_are_real_runs_that_still_match_the_certificate_schema(source):
    certificate = _certificate(source)
    validate(certificate)
    assert certificate["run"]["id"] == source
    assert (DATA / source / "report.html").stat().st_size < 2000


# -- lab-run.json ----------------------------------------------------------------------------------


def test_a_night_is_written_atomically_and_read_back_as_written(nights):
    newest, _previous = nights
    night = read_night(newest)
    assert [h.place for h in night.hosts] == ["lab-a100-1", "lab-a100-2"]
    assert night.hosts[1] == NightHost(
        "lab-a100-2", "held", HELD_REASON, None, None, None, NEWEST_STARTED, NEWEST_STARTED
    )
    assert night.hosts[0].verdict == "nonconformant" and night.hosts[0].exit_code == 1
    assert list(json.loads((newest / NIGHT_FILE).read_text())) == list(NIGHT_KEYS)
    assert [p.name for p in newest.iterdir() if p.name.endswith(".tmp")] == []
    write_night(newest, night)  # again, over the first
    assert read_night(newest) == night


def test_the_reader_and_the_schema_agree_on_keys_statuses_and_verdicts():
    schema = json.loads(SCHEMA_FILE.read_text())
    host = schema["$defs"]["host"]
    assert schema["required"] == list(NIGHT_KEYS) == list(schema["properties"])
    assert host["required"] == list(HOST_KEYS) == list(host["properties"])
    assert schema["additionalProperties"] is False and host["additionalProperties"] is False
    assert host["properties"]["status"]["enum"] == list(STATUSES)
    assert host["properties"]["verdict"]["enum"] == [*OVERALL_VERDICTS, None]


def _good_night() -> dict:
    host = {
        "place": "lab-a100-1",
        "status": "certified",
        "reason": "",
        "run_dir": f"lab-a100-1/{LOADED_A100}",
        "verdict": "nonconformant",
        "exit_code": 1,
        "started": NEWEST_STARTED,
        "ended": "2026-12-04T01:20:00+00:00",
    }
    held = {**host, "place": "lab-a100-2", "status": "held", "reason": HELD_REASON}
    held.update(run_dir=None, verdict=None, exit_code=None)
    return {
        "schema_version": 1,
        "kind": "hilconform-lab-night",
        "coordinator": "127.0.0.1:20408",
        "tags": {"lab": "nightly"},
        "started": NEWEST_STARTED,
        "ended": "2026-12-04T02:00:00Z",
        "hosts": [host, held],
    }


# (what is wrong, the edit, what the message must name)
BAD_NIGHTS = [
    ("unknown key", lambda d: d.update(operator="alice"), "unknown key 'operator'"),
    ("missing key", lambda d: d.pop("coordinator"), "lacks 'coordinator'"),
    ("tags not strings", lambda d: d["tags"].update(lab=1), "tags: lab must be a string"),
    ("no zone", lambda d: d.update(started="2026-12-04T01:00:00"), "started: '2026-12-04T01:00:00'"),
    ("host unknown key", lambda d: d["hosts"][0].update(holder="x"), "hosts[0]: unknown key 'holder'"),
    ("host missing key", lambda d: d["hosts"][1].pop("reason"), "hosts[1]: lacks 'reason'"),
    ("bad status", lambda d: d["hosts"][0].update(status="lost"), "hosts[0]: status 'lost' is unknown"),
    ("exit code type", lambda d: d["hosts"][0].update(exit_code="1"), "hosts[0]: exit_code must be"),
    ("bool exit code", lambda d: d["hosts"][0].update(exit_code=True), "hosts[0]: exit_code must be"),
    ("exit mismatch", lambda d: d["hosts"][0].update(exit_code=0), "exit_code 0 does not go with"),
    ("unknown verdict", lambda d: d["hosts"][0].update(verdict="great"), "verdict 'great'"),
    ("held with a run", lambda d: d["hosts"][1].update(run_dir="x"), "hosts[1]: a held host has no run"),
    ("held exit code", lambda d: d["hosts"][1].update(exit_code=2), "hosts[1]: a held host never ran"),
    ("held no reason", lambda d: d["hosts"][1].update(reason=""), "hosts[1]: a held host needs a reason"),
    ("run dir outside", lambda d: d["hosts"][0].update(run_dir="../elsewhere"), "run_dir '../elsewhere'"),
    ("absolute run dir", lambda d: d["hosts"][0].update(run_dir="/srv/run"), "run_dir '/srv/run'"),
]


@pytest.mark.parametrize("edit, named", [b[1:] for b in BAD_NIGHTS], ids=[b[0] for b in BAD_NIGHTS])
def test_a_bad_night_is_refused_by_the_reader_and_the_schema_alike(tmp_path, edit, named):
    schema = json.loads(SCHEMA_FILE.read_text())
    good = _good_night()
    jsonschema.validate(good, schema)
    bad = copy.deepcopy(good)
    edit(bad)
    (tmp_path / NIGHT_FILE).write_text(json.dumps(bad))
    with pytest.raises(BadNight) as caught:
        read_night(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / NIGHT_FILE}: ")
    assert named in str(caught.value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_a_place_twice_is_refused_and_write_night_checks_before_writing(tmp_path):
    night = read_night(
        make_night(tmp_path / "n", NEWEST_STARTED, [("lab-a100-2", "held", HELD_REASON, None)])
    )
    twice = Night(**{**night.__dict__, "hosts": [*night.hosts, *night.hosts]})
    with pytest.raises(BadNight, match="place 'lab-a100-2' is listed more than once"):
        write_night(tmp_path / "n2", twice)
    assert not (tmp_path / "n2" / NIGHT_FILE).exists()
    assert night_to_dict(night)["kind"] == "hilconform-lab-night"


def test_a_missing_night_dir_or_lab_run_json_is_named(tmp_path):
    with pytest.raises(BadNight, match=f"{tmp_path / 'none'}: not a folder"):
        read_night(tmp_path / "none")
    with pytest.raises(BadNight, match=f"{tmp_path}: no lab-run.json"):
        read_night(tmp_path)
    (tmp_path / NIGHT_FILE).write_text("{")
    with pytest.raises(BadNight, match="lab-run.json: not valid JSON"):
        read_night(tmp_path)


# -- fleet.json --------------------------------------------------------------------------------------


def test_the_matrix_has_each_clause_verdict_and_key_figure_and_the_held_host_its_reason(nights):
    newest, previous = nights
    fleet = build_fleet(newest, [previous])
    assert fleet["kind"] == "hilconform-fleet" and fleet["schema_version"] == 1
    assert fleet["newest_night"] == NEWEST_STARTED
    ids = [c["id"] for c in fleet["clauses"]]
    assert ids == [c["id"] for c in _certificate(LOADED_A100)["clauses"]]  # spec order
    certified, held = fleet["hosts"]
    assert certified["place"] == "lab-a100-1"
    assert (certified["status"], certified["verdict"], certified["exit_code"]) == (
        "certified",
        "nonconformant",
        1,
    )
    assert certified["cells"]["DISC-02"] == {
        "verdict": "fail",
        "figure": {
            "key": "DISC-02 hot_add_discovery_acpi [acpi]",
            "stat": "median",
            "value": _median(LOADED_A100, "DISC-02 hot_add_discovery_acpi [acpi]"),
            "unit": "ms",
        },
    }
    assert certified["cells"]["DISC-03"]["verdict"] == "inconclusive"
    assert certified["cells"]["DISC-01"] == {"verdict": "pass", "figure": None}  # DISC-01 measures nothing
    assert certified["run_dir"] == f"lab-a100-1/{LOADED_A100}"
    assert certified["report"] == f"lab-a100-1/{LOADED_A100}/report.html"
    assert (newest / certified["report"]).is_file()
    assert certified["host"]["spec"] == "emulated:a100" and certified["problem"] is None
    [model] = certified["devices"]
    assert model["ids"] == "10de:20b0" and model["resource"] == "hilconform.io/nvidia-a100-sxm4-40gb"
    assert model["links"] == ["16 GT/s x16 (cap 16 GT/s x16)"] and model["bdfs"] == [
        "0000:01:00.0",
        "0000:02:00.0",
    ]
    assert held["place"] == "lab-a100-2"
    assert (held["status"], held["reason"], held["verdict"], held["report"]) == (
        "held",
        HELD_REASON,
        None,
        None,
    )
    assert held["cells"] == {} and held["devices"] == [] and held["host"] is None


def test_the_nights_side_by_side_list_every_changed_clause_verdict(nights):
    newest, previous = nights
    fleet = build_fleet(newest, [previous])
    assert [n["started"] for n in fleet["nights"]] == [NEWEST_STARTED, PREVIOUS_STARTED]
    assert [n["night_dir"] for n in fleet["nights"]] == [".", "../night-1203"]
    tonight = {h["place"]: h for h in fleet["nights"][0]["hosts"]}
    assert tonight["lab-a100-1"]["changes"] == [
        {"clause": "DISC-02", "before": "pass", "after": "fail"},
        {"clause": "DISC-03", "before": "pass", "after": "inconclusive"},
    ]
    assert tonight["lab-a100-1"]["compared_with"] == PREVIOUS_STARTED
    assert tonight["lab-a100-1"]["verdict_before"] == "conformant"
    assert tonight["lab-a100-2"]["changes"] == [] and tonight["lab-a100-2"]["compared_with"] is None
    last_night = {h["place"]: h for h in fleet["nights"][1]["hosts"]}
    assert {p: h["verdict"] for p, h in last_night.items()} == {
        "lab-a100-1": "conformant",
        "lab-a100-2": "conformant",
    }
    assert last_night["lab-a100-2"]["report"] == f"../night-1203/lab-a100-2/{IDLE_STOCK}/report.html"


def test_each_clause_key_figure_is_followed_over_the_nights_per_host(nights):
    newest, previous = nights
    trends = {t["clause"]: t for t in build_fleet(newest, [previous])["trends"]}
    assert "DISC-01" not in trends  # no figure: no trend
    key = "DISC-03 cold_discovery"
    series = {s["place"]: s for s in trends["DISC-03"]["series"]}
    assert series["lab-a100-1"]["key"] == key and series["lab-a100-1"]["unit"] == "ms"
    assert series["lab-a100-1"]["points"] == [
        {"night": PREVIOUS_STARTED, "value": _median(IDLE_A100, key)},
        {"night": NEWEST_STARTED, "value": _median(LOADED_A100, key)},
    ]
    # held tonight: its line ends with a gap
    assert [p["value"] for p in series["lab-a100-2"]["points"]] == [_median(IDLE_STOCK, key), None]


def test_nights_are_ordered_by_when_they_started_not_by_argument_order(nights):
    newest, previous = nights
    fleet = build_fleet(previous, [newest])
    assert fleet["newest_night"] == NEWEST_STARTED
    assert [h["place"] for h in fleet["hosts"]] == ["lab-a100-1", "lab-a100-2"]
    assert fleet["hosts"][1]["status"] == "held"
    with pytest.raises(BadNight, match="the same night is given twice"):
        build_fleet(newest, [previous, newest])


def test_a_certified_host_without_its_certificate_shows_why(nights):
    newest, previous = nights
    (newest / "lab-a100-1" / LOADED_A100 / "certificate.json").unlink()
    host = build_fleet(newest, [previous])["hosts"][0]
    assert host["problem"] == f"lab-a100-1/{LOADED_A100}/certificate.json is missing"
    assert host["cells"] == {} and host["verdict"] == "nonconformant"  # as lab-run.json recorded it


def test_fleet_json_is_written_beside_the_night_and_read_back_strictly(nights):
    newest, previous = nights
    json_path, html_path = write_fleet_report(newest, [previous])
    assert (json_path, html_path) == (newest / "fleet.json", newest / "fleet.html")
    fleet = read_fleet(json_path)
    assert fleet == build_fleet(newest, [previous])
    edits = [
        (lambda f: f.update(generated="today"), "(top level): Additional properties"),
        (lambda f: f["hosts"][0].update(colour="red"), "hosts/0: Additional properties"),
        (lambda f: f["hosts"][1].update(status="lost"), "hosts/1/status: 'lost' is not one of"),
        (lambda f: f["nights"][0]["hosts"][0]["changes"][0].update(after="meh"), "changes/0/after"),
        (lambda f: f.pop("trends"), "'trends' is a required property"),
    ]
    for edit, named in edits:
        bad = copy.deepcopy(fleet)
        edit(bad)
        json_path.write_text(json.dumps(bad))
        with pytest.raises(BadFleet) as caught:
            read_fleet(json_path)
        assert str(caught.value).startswith(str(json_path)) and named in str(caught.value)


# -- the command -------------------------------------------------------------------------------------


def test_lab_report_prints_the_two_paths_and_exits_0(nights, tmp_path, capsys):
    newest, previous = nights
    assert cli.main(["lab", "report", str(newest), str(previous)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(newest / "fleet.json"), str(newest / "fleet.html")]
    assert cli.main(["lab", "report", str(newest), "--out", str(tmp_path / "out")]) == 0
    assert read_fleet(tmp_path / "out" / "fleet.json")["hosts"][0]["report"] == (
        f"../night-1204/lab-a100-1/{LOADED_A100}/report.html"
    )


def test_lab_report_exits_2_with_one_line_naming_what_is_wrong(nights, tmp_path, capsys):
    newest, previous = nights
    missing = tmp_path / "no-such-night"
    night_file = newest / NIGHT_FILE
    cases = [
        ([str(missing)], f"{missing}: not a folder"),
        ([str(newest), str(tmp_path)], f"{tmp_path}: no lab-run.json"),
    ]
    for args, named in cases:
        assert cli.main(["lab", "report", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("hilconform: error: ") and named in err
    night_file.write_text(night_file.read_text().replace('"held"', '"lost"'))
    assert cli.main(["lab", "report", str(newest), str(previous)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{night_file}: hosts[1]: status 'lost' is unknown" in err
    night_file.write_text("{not json")
    assert cli.main(["lab", "report", str(newest)]) == 2
    assert f"{night_file}: not valid JSON" in capsys.readouterr().err
    assert not (newest / "fleet.json").exists()


def test_the_installed_command_exits_2_on_a_missing_night(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hilconform.reports", "lab", "report", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr == f"hilconform: error: {tmp_path / 'none'}: not a folder (a NIGHT_DIR written by "
        "`hilconform lab run`)\n"
    )


# -- fleet.html ----------------------------------------------------------------------------------------


def test_fleet_html_is_self_contained_and_escapes_what_the_lab_wrote(tmp_path):
    hostile = "held by ci-b/<script>alert(1)</script>"
    previous = make_night(tmp_path / "p", PREVIOUS_STARTED, [("lab-a100-1", "certified", "", IDLE_A100)])
    newest = make_night(
        tmp_path / "n",
        NEWEST_STARTED,
        [("lab-a100-1", "certified", "", LOADED_A100), ('<b>x"', "held", hostile, None)],
    )
    _json_path, html_path = write_fleet_report(newest, [previous])
    page = html_path.read_text()
    assert "<script" not in page and "alert(1)" in page
    assert "ci-b/&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;x&quot;" in page
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|url\(|@import", page)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)


def test_a_trend_breaks_its_line_where_a_night_has_no_figure():
    svg = svg_plots.trend(
        [("a", [1.0, 2.0, None, 4.0, 5.0]), ("b", [None, 3.0, None, None, None])], list("12345"), "ms"
    )
    assert svg.count("<polyline") == 2  # a: 1-2 and 4-5; b: one point, no line
    assert svg.count("<circle") == 5
    assert "b, 2: 3 ms" in svg


def test_fleet_html_renders_in_headless_chromium_with_hosts_changes_and_trends(nights, tmp_path):
    newest, previous = nights
    _json_path, html_path = write_fleet_report(newest, [previous])
    dom = _render_in_chromium(html_path, tmp_path)
    assert "hilconform fleet report" in dom
    matrix = re.search(r'<table id="matrix">(.*?)</table>', dom, re.S).group(1)
    assert 'data-place="lab-a100-1"' in matrix and 'data-place="lab-a100-2"' in matrix
    assert ">held by ci-b/bob<" in matrix
    nights_table = re.search(r'<table id="nights">(.*?)</table>', dom, re.S).group(1)
    assert "DISC-02: pass → fail" in nights_table and "DISC-03: pass → inconclusive" in nights_table
    trend = re.search(r'<div class="trend-block" data-clause="DISC-02">(.*?)</div>', dom, re.S).group(1)
    assert re.search(r'<svg [^>]*class="trend"', trend) and trend.count("<circle") == 3
    assert dom.count('class="trend"') == len(build_fleet(newest, [previous])["trends"])
