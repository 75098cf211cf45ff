"""report.html: one self-contained page (inline CSS, SVG and script; opens offline).

Verdict banner and table per clause, each measured figure's distribution
against its budget, the device inventory, a per-device lifecycle timeline
drawn from the runtime events the suites received, and the device plugin the
DP clauses certified.
"""

from __future__ import annotations

import json
from html import escape

from . import svg_plots
from .run_folder import RunFolder

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{margin-bottom:4px} table{border-collapse:collapse;margin:8px 0 20px} td,th{border:1px solid #ccc;
padding:4px 8px;text-align:left;vertical-align:top;font-size:13px} th{background:#f3f3f3}
.banner{padding:14px 18px;font-size:22px;font-weight:600;border-radius:6px;margin:12px 0}
.v-conformant,.v-pass{background:#d9f2d9} .v-partial,.v-not_checked,.v-inconclusive{background:#fff4cc}
.v-nonconformant,.v-fail{background:#f8d0d0} .v-incomplete,.v-broken,.v-not_run{background:#e4e4f4}
#verdicts{width:100%;table-layout:fixed} #verdicts td{overflow-wrap:anywhere}
.muted{word-break:break-all}
.msg{font-family:monospace;font-size:11px;white-space:pre-wrap;max-width:480px;word-break:break-all}
.muted{color:#777}
#js-errors{color:#a00;font-family:monospace}
"""

SCRIPT = """
window.onerror = function (msg, src, line) {
  document.getElementById('js-errors').textContent += 'script error: ' + msg + ' (line ' + line + ')\\n';
};
document.addEventListener('DOMContentLoaded', function () {
  var box = document.getElementById('only-problems');
  box.addEventListener('change', function () {
    document.querySelectorAll('tr.clause-row').forEach(function (row) {
      row.hidden = box.checked && row.dataset.verdict === 'pass';
    });
  });
  var data = JSON.parse(document.getElementById('certificate-summary').textContent);
  var counts = {};
  data.clauses.forEach(function (c) { counts[c.verdict] = (counts[c.verdict] || 0) + 1; });
  document.getElementById('clause-counts').textContent = Object.keys(counts).sort().map(function (k) {
    return k + ': ' + counts[k]; }).join(', ');
  document.body.dataset.rendered = 'yes';
});
"""


def _row(cells: list[str], attrs: str = "") -> str:
    return f"<tr{attrs}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _verdict_table(certificate: dict) -> str:
    rows = []
    for clause in certificate["clauses"]:
        tests = (
            "<br>".join(
                f'{escape(t["outcome"])} <span class="muted" title="{escape(t["nodeid"])}">'
                f"{escape(t['nodeid'].split('::')[-1])} ({t['duration_s']:.1f} s)</span>"
                + (
                    f'<div class="msg">{escape(t["message"][:300])}</div>'
                    if t["message"] and t["outcome"] != "passed"
                    else ""
                )
                for t in clause["tests"]
            )
            or '<span class="muted">no test ran</span>'
        )
        figures = "<br>".join(
            f"{escape(f['key'])}: median {f['median']:g}, p95 {f['p95']:g} {escape(f['unit'])}"
            + (
                f" (budget {escape(str(f['budget_stat']))} ≤ {f['budget']:g}: "
                f"{'met' if f['within_budget'] else 'MISSED'})"
                if f["budget"] is not None
                else ""
            )
            for f in clause["figures"]
        )
        held = "".join(
            f'<div class="muted">precondition {escape(h["name"])}: '
            f"{'met' if h['met'] else 'MISSED' if h['met'] is False else 'not judged'}, held "
            f"{'?' if h['held_ms'] is None else format(h['held_ms'], '.0f')} ms until "
            f"{escape(str(h['released_by']))} ({escape(h['release_on'])})</div>"
            for h in clause.get("preconditions", [])
        )
        rows.append(
            _row(
                [
                    escape(clause["id"]),
                    escape(clause["statement"]),
                    f"<b>{escape(clause['verdict'])}</b>",
                    tests,
                    figures + held,
                ],
                f' class="clause-row v-{clause["verdict"]}" data-verdict="{clause["verdict"]}"',
            )
        )
    for test in certificate["other_tests"]:
        rows.append(
            _row(
                [
                    "—",
                    "(test without a clause)",
                    f"<b>{escape(test['outcome'])}</b>",
                    escape(test["nodeid"]),
                    "",
                ],
                ' class="clause-row" data-verdict="other"',
            )
        )
    head = "<tr><th>Clause</th><th>Statement</th><th>Verdict</th><th>Tests</th><th>Figures</th></tr>"
    widths = "".join(f'<col style="width:{w}">' for w in ("7%", "17%", "7%", "44%", "25%"))
    return f"<table id='verdicts'><colgroup>{widths}</colgroup>{head}{''.join(rows)}</table>"


def _figures(certificate: dict) -> str:
    blocks = []
    for clause in certificate["clauses"]:
        for f in clause["figures"]:
            if not f["values"]:
                continue
            plot = svg_plots.distribution(
                f["values"], f["unit"], f["budget"], f["budget_stat"], f["median"], f["p95"]
            )
            blocks.append(
                f'<h3>{escape(f["key"])}</h3><p class="muted">n={f["n"]}, min {f["min"]:g}, '
                f"median {f['median']:g}, p95 {f['p95']:g}, max {f['max']:g} {escape(f['unit'])}</p>"
                f"{plot}"
            )
    return "".join(blocks) or '<p class="muted">No figures were measured in this run.</p>'


def _devices(certificate: dict) -> str:
    if not certificate["devices"]:
        return '<p class="muted">No device inventory was recorded (no test connected to the runtime).</p>'
    head = (
        "<tr><th>Host instance</th><th>BDF</th><th>IDs</th><th>Subsystem</th><th>Class</th>"
        "<th>Driver</th><th>Firmware</th><th>Link</th><th>Slot</th><th>State</th></tr>"
    )
    rows = []
    for d in certificate["devices"]:
        link = d["link"]
        link_text = (
            (
                f"{link.get('speed_gts')} GT/s x{link.get('width')} (cap {link.get('cap_speed_gts')} GT/s "
                f"x{link.get('cap_width')})"
            )
            if link
            else "—"
        )
        rows.append(
            _row(
                [
                    escape(str(v))
                    for v in (
                        d["host_instance"],
                        d["bdf"],
                        f"{d['vendor_id']}:{d['device_id']}",
                        f"{d['subsystem_vendor_id']}:{d['subsystem_id']}",
                        d["class_code"],
                        d["driver"] or "—",
                        d["firmware"] or "—",
                        link_text,
                        d["slot"] or "—",
                        d["state"],
                    )
                ]
            )
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _device_plugin(certificate: dict) -> str:
    """The plugin the DP clauses certified; nothing at all when no DP test ran."""
    plugin = certificate.get("device_plugin")
    if not plugin:
        return ""
    if plugin["kind"] == "command":
        named = [("command", plugin["command"]), ("executable", plugin["path"]), ("sha256", plugin["sha256"])]
        rows = [_row([name, f"<code>{escape(value)}</code>"]) for name, value in named]
    elif plugin["kind"] == "image":
        image = plugin.get("image") or {}
        manifest = image.get("manifest") or {}
        named = [("image", f"{image.get('ref') or ''} {image.get('form', '')}"),
                 ("digest", image.get("digest")), ("image file", plugin["path"]),
                 ("file sha256", plugin["sha256"]), ("runs", plugin["command"])]
        if manifest:
            container = f"{manifest['kind']} {manifest['path']} (container {manifest['container']})"
            named += [("manifest", container), ("manifest sha256", manifest["sha256"])]
        rows = [_row([name, f"<code>{escape(str(value))}</code>"]) for name, value in named]
    else:
        rows = [_row(["plugin", escape("the reference runtime's own device-plugin front end")])]
    resources = "<br>".join(
        f"{escape(r['name'])}: {escape(', '.join(r['device_ids']))}" for r in plugin["resources"]
    )
    versions = ", ".join(plugin["api_versions"]) or "not seen"
    claims = "<br>".join(
        f"{escape(c['name'])} ({escape(c['clause'])} judged under it): {escape(c['meaning'])}"
        for c in plugin.get("claims", [])
    )
    rows += [
        _row(["resources", resources or '<span class="muted">none recorded</span>']),
        _row(["Register API version", escape(versions)]),
        _row(["declared claims", claims or '<span class="muted">none: clauses that need a claim were '
              "skipped</span>"]),
    ]
    return f"<h2>Device plugin</h2><table id='device-plugin'>{''.join(rows)}</table>"


def timeline_rows(events: dict[str, list[dict]]) -> tuple[list, float]:
    """Health-state segments and discovered/removed markers per (host instance, device).

    Seconds from the run's first event (host receipt, CLOCK_MONOTONIC: the same clock in every
    worker); a device's last state lasts until its VM's last recorded event. VMs in start order.
    """
    logs = {name: [e for e in log if "host_ns" in e] for name, log in events.items()}
    logs = {name: log for name, log in logs.items() if log}
    if not logs:
        return [], 0.0
    t0 = min(e["host_ns"] for log in logs.values() for e in log)
    end_s = (max(e["host_ns"] for log in logs.values() for e in log) - t0) / 1e9
    rows = []
    for instance, log in sorted(logs.items(), key=lambda item: item[1][0]["host_ns"]):
        instance_end = (log[-1]["host_ns"] - t0) / 1e9
        per_device: dict[str, dict] = {}
        for event in log:
            data = event.get("data") or {}
            device = data.get("device")
            if not device:
                continue
            at = (event["host_ns"] - t0) / 1e9
            track = per_device.setdefault(device, {"segments": [], "markers": [], "state": None, "since": at})
            if event["event"] == "transition" and data.get("view") == "health":
                if track["state"] is not None:
                    track["segments"].append((track["since"], at, track["state"]))
                track["state"], track["since"] = data.get("to"), at
            elif event["event"] in ("discovered", "removed"):
                track["markers"].append((at, f"{event['event']} ({data.get('cause')})"))
        for device, track in sorted(per_device.items()):
            if track["state"] == "REMOVED":  # a short grey mark: the device is gone
                track["segments"].append((track["since"], min(track["since"] + 0.2, end_s), "REMOVED"))
            elif track["state"] is not None:
                track["segments"].append((track["since"], instance_end, track["state"]))
            if track["segments"] or track["markers"]:
                rows.append((f"{instance[-12:]} {device}", track["segments"], track["markers"]))
    return rows, end_s


def _timeline(events: dict[str, list[dict]]) -> str:
    rows, end_s = timeline_rows(events)
    if not rows:
        return '<p class="muted">No runtime events were recorded.</p>'
    legend = " ".join(
        f'<span style="background:{c};padding:0 6px">{s}</span>' for s, c in svg_plots.STATE_COLOURS.items()
    )
    return f"<p>{legend} ▼ discovered/removed</p>" + svg_plots.timeline(rows, end_s)


def _sensitivity(run: RunFolder, sensitivity: dict | None) -> str:
    """The self-check's result: its summary and the table it wrote (sensitivity.md), else its JSON."""
    if not sensitivity:
        return ""
    table = run.sensitivity_dir / "sensitivity.md"
    body = table.read_text() if table.is_file() else json.dumps(sensitivity.get("tables"), indent=1)
    return (
        f"<h2>Suite sensitivity (self-check)</h2><p>{escape(str(sensitivity.get('summary')))} "
        f"(exit {sensitivity.get('exit_code')})</p><pre>{escape(body)}</pre>"
    )


def render(certificate: dict, run: RunFolder) -> str:
    verdict = certificate["verdict"]
    run_info = certificate["run"]
    versions = certificate["versions"]
    summary = _script_json(
        {
            "verdict": verdict,
            "clauses": [{"id": c["id"], "verdict": c["verdict"]} for c in certificate["clauses"]],
        }
    )
    reasons = "".join(f"<li>{escape(r)}</li>" for r in certificate["reasons"])
    version_rows = "".join(_row([escape(k), escape(str(v))]) for k, v in versions.items())
    sensitivity = certificate.get("sensitivity")
    sensitivity_html = _sensitivity(run, sensitivity)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>hilconform certificate {escape(run_info["id"])}: {escape(verdict)}</title>
<style>{STYLE}</style></head>
<body>
<h1>hilconform certification report</h1>
<p class="muted">run {escape(run_info["id"])}, host {escape(str(certificate["host"]["spec"]))}, started
{escape(str(run_info["started"]))}, {run_info["duration_s"] or 0:.0f} s</p>
<div id="verdict" class="banner v-{escape(verdict)}">Verdict: {escape(verdict.upper())}
(exit {certificate["exit_code"]}, {escape(certificate["status"])})</div>
<ul id="reasons">{reasons}</ul>
<div id="js-errors"></div>
<h2>Clauses</h2>
<p><label><input type="checkbox" id="only-problems"> only clauses that did not pass</label>
<span id="clause-counts" class="muted"></span></p>
{_verdict_table(certificate)}
<h2>Measured figures</h2>
{_figures(certificate)}
<h2>Device lifecycle timeline</h2>
{_timeline(run.runtime_events())}
<h2>Devices</h2>
{_devices(certificate)}
{_device_plugin(certificate)}
<h2>Versions</h2>
<table>{version_rows}</table>
{sensitivity_html}
<script type="application/json" id="certificate-summary">{summary}</script>
<script>{SCRIPT}</script>
</body></html>
"""


def _script_json(value) -> str:
    """JSON safe inside a <script> element (no "</" that could end it)."""
    return json.dumps(value).replace("</", "<\\/")


def write(run: RunFolder, certificate: dict) -> None:
    tmp = run.html.with_suffix(".tmp")
    tmp.write_text(render(certificate, run))
    tmp.replace(run.html)
