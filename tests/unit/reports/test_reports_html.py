"""report.html: self-contained (nothing fetched), verdict table, plots and timeline; and it renders in
Debian's headless chromium with no script error and shows the verdict."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from recorded_runs import (
    COMMAND_PLUGIN,
    DISC01,
    PLUGIN_SHA256,
    record_device_plugin,
    recorded_run,
    set_outcome,
)

from hilconform.reports import certify
from hilconform.reports.html_report import timeline_rows

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def test_page_is_self_contained_and_shows_verdict_figures_and_timeline(tmp_path):
    run = recorded_run(tmp_path)
    certify.finish(run)
    page = run.html.read_text()
    assert "Verdict: CONFORMANT" in page
    # nothing is loaded from anywhere: no external scripts, styles, images or frames
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|url\(|@import", page)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    assert page.count('class="dist"') == 2  # one distribution per measured figure
    assert page.count('class="timeline"') == 1
    assert 'data-verdict="pass"' in page


def test_page_names_the_device_plugin_certified_and_has_no_plugin_section_without_one(tmp_path):
    without = recorded_run(tmp_path, "without")
    certify.finish(without)
    assert "Device plugin" not in without.html.read_text()
    run = recorded_run(tmp_path)
    record_device_plugin(run)
    certify.finish(run)
    section = re.search(r"<h2>Device plugin</h2>(.*?)</table>", run.html.read_text(), re.S).group(1)
    for shown in (COMMAND_PLUGIN["command"], COMMAND_PLUGIN["path"], PLUGIN_SHA256):
        assert f"<code>{shown}</code>" in section
    assert "example.com/gpu: 10de:20b0" in section and "v1beta1" in section


def test_page_says_when_the_reference_front_end_was_the_plugin_certified(tmp_path):
    run = recorded_run(tmp_path)
    record_device_plugin(run, kind="reference-front-end", command=None, path=None, sha256=None)
    certify.finish(run)
    section = re.search(r"<h2>Device plugin</h2>(.*?)</table>", run.html.read_text(), re.S).group(1)
    assert "the reference runtime&#x27;s own device-plugin front end" in section
    assert "sha256" not in section


def test_timeline_has_one_row_per_device_with_health_segments(tmp_path):
    run = recorded_run(tmp_path)
    rows, end_s = timeline_rows(run.runtime_events())
    assert len(rows) == 4 and end_s > 0
    for _label, segments, markers in rows:
        assert segments and all(0 <= start <= stop <= end_s for start, stop, _state in segments)
        assert {state for *_, state in segments} <= {"DISCOVERED", "HEALTHY"}
        assert any(text.startswith("discovered") for _at, text in markers)


def _render_in_chromium(page, tmp_path) -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make setup installs it)")
    done = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("outcome, verdict", [("passed", "CONFORMANT"), ("failed", "NONCONFORMANT")])
def test_report_renders_in_headless_chromium_without_script_errors(tmp_path, outcome, verdict):
    run = recorded_run(tmp_path)
    set_outcome(run, DISC01, outcome, "AssertionError: vendor_id dead != 1b36" if outcome == "failed" else "")
    certify.finish(run)
    dom = _render_in_chromium(run.html, tmp_path)
    assert 'data-rendered="yes"' in dom, "the page's script did not run to its end"
    assert re.search(r'<div id="js-errors"></div>', dom), "the page reported a script error"
    assert f"Verdict: {verdict}" in dom
    counts = re.search(r'id="clause-counts"[^>]*>([^<]*)<', dom).group(1)
    assert counts == ("pass: 2" if outcome == "passed" else "fail: 1, pass: 1")
