"""certificate.json from run folders: verdicts, figures, devices, versions, and its schema."""

from __future__ import annotations

import copy

import pytest
from recorded_runs import (
    COMMAND_PLUGIN,
    DISC01,
    DISC03,
    PLUGIN_SHA256,
    record_device_plugin,
    recorded_run,
    rewrite_progress,
    set_outcome,
    update_run,
)

from hilconform.reports import certificate
from hilconform.reports.certificate import CertificateInvalid, build, validate


def test_recorded_passing_run_is_conformant_with_its_figures_devices_and_versions(tmp_path):
    cert = build(recorded_run(tmp_path))
    assert (cert["verdict"], cert["status"], cert["exit_code"]) == ("conformant", "complete", 0)
    assert [c["id"] for c in cert["clauses"]] == ["DISC-01", "DISC-03"]
    assert {c["verdict"] for c in cert["clauses"]} == {"pass"}
    figure = next(f for f in cert["clauses"][1]["figures"] if f["name"] == "cold_discovery")
    assert (
        figure["budget"] == 6000.0
        and figure["budget_stat"] == "max"
        and figure["n"] == len(figure["values"]) == 5
    )
    assert figure["min"] <= figure["median"] <= figure["p95"] <= figure["max"]
    assert len(cert["devices"]) == 4
    assert {(d["vendor_id"], d["device_id"], d["driver"], d["firmware"]) for d in cert["devices"]} == {
        ("1b36", "0010", "nvme", "1.0")
    }
    assert cert["versions"]["qemu"] == "7.2.22" and cert["versions"]["protocol"] == 1
    assert cert["versions"]["runtime"] == "hilconform-reference"
    assert cert["host"]["spec"] == "emulated:a100" and cert["host"]["profile"] == "a100"
    assert cert["host"]["budgets"]["cold_discovery_ms"] == figure["budget"]


def test_a_failed_clause_makes_the_run_nonconformant_even_with_an_infrastructure_error(tmp_path):
    run = recorded_run(tmp_path)
    set_outcome(run, DISC01, "failed", "AssertionError: vendor_id dead != 1b36")
    set_outcome(run, DISC03, "broken", "QemuDied: QEMU exited with status 1")
    cert = build(run)
    assert (cert["verdict"], cert["exit_code"], cert["status"]) == ("nonconformant", 1, "complete")
    verdicts = {c["id"]: c["verdict"] for c in cert["clauses"]}
    assert verdicts == {"DISC-01": "fail", "DISC-03": "broken"}
    assert any("DISC-01" in r for r in cert["reasons"]) and any("DISC-03" in r for r in cert["reasons"])


def test_an_infrastructure_error_alone_makes_the_run_incomplete(tmp_path):
    run = recorded_run(tmp_path)
    set_outcome(run, DISC03, "broken", "ImageMissing: guest image incomplete")
    cert = build(run)
    assert (cert["verdict"], cert["exit_code"], cert["status"]) == ("incomplete", 2, "incomplete")


def test_skipped_clauses_are_not_checked_and_the_run_is_partial(tmp_path):
    run = recorded_run(tmp_path)
    set_outcome(run, DISC03, "skipped", "host lacks capability 'aer-fatal'")
    cert = build(run)
    assert {c["id"]: c["verdict"] for c in cert["clauses"]}["DISC-03"] == "not_checked"
    assert (cert["verdict"], cert["exit_code"]) == ("partial", 0)
    assert any("DISC-03" in r and "not checked" in r for r in cert["reasons"])


def test_an_interrupted_run_is_incomplete_and_names_the_test_it_cut_short(tmp_path):
    run = recorded_run(tmp_path)
    rewrite_progress(
        run,
        lambda r: (
            None
            if r.get("kind") == "session_finish" or (r.get("kind") == "test" and r["nodeid"] == DISC03)
            else r
        ),
    )
    update_run(run, status="interrupted", interrupted="SIGINT received", pytest_exit=2)
    cert = build(run)
    assert (cert["verdict"], cert["status"], cert["exit_code"]) == ("incomplete", "incomplete", 2)
    assert cert["run"]["unfinished_tests"] == [DISC03]
    assert {c["id"]: c["verdict"] for c in cert["clauses"]} == {"DISC-01": "pass", "DISC-03": "not_run"}
    assert "interrupted: SIGINT received" in cert["reasons"]


def test_a_pytest_that_never_reported_its_end_is_incomplete(tmp_path):
    run = recorded_run(tmp_path)
    rewrite_progress(run, lambda r: None if r.get("kind") == "session_finish" else r)
    update_run(run, pytest_exit=None)
    assert build(run)["verdict"] == "incomplete"


def test_a_failing_test_without_a_clause_makes_the_run_incomplete(tmp_path):
    run = recorded_run(tmp_path)
    with run.progress.open("a") as out:
        out.write(
            '{"kind": "test", "nodeid": "suites/smoke/test_emulated_host.py::test_boots", "clause": null, '
            '"outcome": "failed", "message": "boom", "duration_s": 1.0}\n'
        )
    cert = build(run)
    assert cert["verdict"] == "incomplete"
    assert cert["other_tests"][0]["outcome"] == "failed"


def test_schema_rejects_inconsistent_or_incomplete_certificates(tmp_path):
    good = build(recorded_run(tmp_path))
    validate(good)
    bad_exit = copy.deepcopy(good)
    bad_exit["exit_code"] = 1
    missing = copy.deepcopy(good)
    del missing["clauses"][0]["verdict"]
    bad_status = copy.deepcopy(good)
    bad_status["verdict"] = "incomplete"
    bad_status["exit_code"] = 2
    for broken, where in ((bad_exit, "exit_code"), (missing, "clauses/0"), (bad_status, "status")):
        with pytest.raises(CertificateInvalid, match=where):
            validate(broken)


def test_the_schema_file_is_valid_json_schema_and_names_the_version():
    import jsonschema

    schema = certificate.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"] == {"const": certificate.SCHEMA_VERSION}


def test_tool_versions_come_from_the_run_not_from_a_later_rebuild(tmp_path):
    run = recorded_run(tmp_path)
    at_run_time = {
        "hilconform": "0.0.9",
        "python": "3.11.2",
        "pytest": "8.0.0",
        "hilconform_checkout": "abc1234",
    }
    update_run(run, tool_versions=at_run_time)
    versions = build(run)["versions"]
    assert {k: versions[k] for k in at_run_time} == at_run_time
    assert versions["qemu"] == "7.2.22"  # the test bed's versions come from the host records


def test_a_crashed_test_and_a_test_with_no_record_never_leave_their_clause_passed(tmp_path):
    """The scope names both tests; DISC-01's crashed (xdist's last word), DISC-03's left no line at all
    (its worker's report never arrived): neither clause passes, the run is incomplete, both are named."""
    run = recorded_run(tmp_path)

    def edit(record):
        if record.get("kind") == "test" and record["nodeid"] == DISC01:
            return {**record, "clause": None, "outcome": "crashed", "message": "worker 'gw0' crashed"}
        if record.get("kind") in ("test", "start") and record["nodeid"] == DISC03:
            return None
        return record

    rewrite_progress(run, edit)
    cert = build(run)
    assert (cert["verdict"], cert["exit_code"]) == ("incomplete", 2)
    assert {c["id"]: c["verdict"] for c in cert["clauses"]} == {"DISC-01": "incomplete", "DISC-03": "not_run"}
    assert sorted(cert["run"]["unfinished_tests"]) == sorted([DISC01, DISC03])
    disc03 = next(c for c in cert["clauses"] if c["id"] == "DISC-03")["tests"]
    assert disc03 == [
        {
            "nodeid": DISC03,
            "outcome": "unfinished",
            "duration_s": 0.0,
            "message": "did not finish: never started",
        }
    ]
    assert any(DISC01 in r and DISC03 in r for r in cert["reasons"]), cert["reasons"]


def test_a_run_without_dp_tests_names_no_device_plugin(tmp_path):
    assert build(recorded_run(tmp_path))["device_plugin"] is None


def test_the_certificate_names_the_command_plugin_its_sha256_resources_and_register_version(tmp_path):
    """Two workers ran DP tests: one plugin, the resources and Register versions each saw joined."""
    run = recorded_run(tmp_path)
    record_device_plugin(run, "gw0")
    record_device_plugin(
        run,
        "gw1",
        resources=[
            {"name": "example.com/gpu", "device_ids": ["10de:20b2"]},
            {"name": "example.com/fpga", "device_ids": ["1d0f:f010"]},
        ],
        api_versions=[],
    )
    plugin = build(run)["device_plugin"]  # build validates it against the schema
    assert plugin == {
        "kind": "command",
        "command": COMMAND_PLUGIN["command"],
        "path": "/home/lab/plugins/my-plugin",
        "sha256": PLUGIN_SHA256,
        "image": None,
        "resources": [
            {"name": "example.com/fpga", "device_ids": ["1d0f:f010"]},
            {"name": "example.com/gpu", "device_ids": ["10de:20b0", "10de:20b2"]},
        ],
        "api_versions": ["v1beta1"],
        "claims": [],
    }


def test_the_certificate_says_the_reference_front_end_was_certified(tmp_path):
    run = recorded_run(tmp_path)
    resources = [{"name": "hilconform.io/nvidia-a100-sxm4-40gb", "device_ids": ["1b36:0010"]}]
    record_device_plugin(
        run, kind="reference-front-end", command=None, path=None, sha256=None, resources=resources
    )
    plugin = build(run)["device_plugin"]
    assert (plugin["kind"], plugin["command"], plugin["sha256"]) == ("reference-front-end", None, None)
    assert plugin["resources"] == resources


@pytest.mark.parametrize(
    "edit",
    [
        {"sha256": "not-a-digest"},
        {"sha256": None},  # a command plugin always has its executable's digest
        {"kind": "reference-front-end"},  # ... and the reference front end has none
        {"kind": "operator"},
        {"resources": [{"name": "example.com/gpu", "device_ids": ["10DE-20B0"]}]},
        {"signed_by": "someone"},
    ],
)
def test_the_schema_refuses_a_device_plugin_it_does_not_describe(tmp_path, edit):
    run = recorded_run(tmp_path)
    record_device_plugin(run)
    good = build(run)
    bad = copy.deepcopy(good)
    bad["device_plugin"].update(edit)
    with pytest.raises(CertificateInvalid, match="device_plugin"):
        validate(bad)


def test_a_clause_lists_the_preconditions_its_tests_held_and_a_missed_one_is_inconclusive(tmp_path):
    """What fixtures/preconditions.py writes reaches the clause, met or missed, with its hold."""
    import json

    run = recorded_run(tmp_path)
    folder = run.measurements_dir / "preconditions"
    folder.mkdir(parents=True)
    held = {"nodeid": DISC03, "clause": "DISC-03", "name": "read_in_flight_gpu0",
            "precondition": "a read in flight when the drain starts", "release_on": "isolate",
            "held_from_ns": 1, "released_ns": 2_000_001, "released_by": "event", "event_seq": 7,
            "held_ms": 2.0, "met": False, "note": "the drain's first poll found it done"}
    (folder / "DISC-03-read-0.json").write_text(json.dumps(held))
    set_outcome(run, DISC03, "inconclusive", "Inconclusive: DISC-03 precondition missed")
    cert = build(run)
    disc03 = next(c for c in cert["clauses"] if c["id"] == "DISC-03")
    assert disc03["verdict"] == "inconclusive" and cert["exit_code"] == 2
    assert disc03["preconditions"] == [{k: held[k] for k in certificate.PRECONDITION_KEYS}]
    assert next(c for c in cert["clauses"] if c["id"] == "DISC-01")["preconditions"] == []


def test_the_certificate_names_a_plugin_image_by_its_digest_and_manifest(tmp_path):
    """A --device-plugin-image run (fixtures/image_plugin.py's identity): kind image, the image's file,
    form, digest and reference, the manifest's path, SHA-256 and what of it was left aside; shown in
    report.html."""
    manifest = {"path": "/lab/daemonset.yaml", "sha256": "b" * 64, "kind": "DaemonSet",
                "container": "pciwatch", "image": "example.com/pciwatch:1.0",
                "left_aside": ["pod tolerations: no meaning on one node"]}
    image = {"path": "/lab/pciwatch-oci.tar", "form": "oci-archive", "digest": "sha256:" + "a" * 64,
             "ref": "example.com/pciwatch:1.0", "manifest": manifest}
    run = recorded_run(tmp_path)
    record_device_plugin(run, kind="image", command="example.com/pciwatch:1.0@sha256:aaa: /usr/bin/pciwatch",
                         path=image["path"], image=image)
    cert = build(run)  # validates against the schema
    assert cert["device_plugin"]["kind"] == "image" and cert["device_plugin"]["image"] == image
    record_device_plugin(run, kind="image", image=None)
    with pytest.raises(CertificateInvalid):
        build(run)  # an image run must name its image
