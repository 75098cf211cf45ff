"""fleet.html: the fleet report as one self-contained page (inline CSS and SVG, no script), drawn
from fleet.json's content alone, so the page and the data can never tell different stories.

Every text that comes from a certificate or lab-run.json (place names, holders, reasons, figure
keys, statements) is escaped: a lab's files are data, never markup.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from . import svg_plots
from .html_report import STYLE as CERTIFICATE_STYLE

STYLE = (
    CERTIFICATE_STYLE
    + """
body{max-width:none} .scroll{overflow-x:auto;max-width:100%}
#matrix td,#matrix th{font-size:11px;padding:2px 5px;white-space:nowrap}
#matrix td.place,#matrix th.place{position:sticky;left:0;background:#fff}
.fig{color:#333;font-size:10px} .problem{color:#a00} .muted{color:#777}
.s-held,.s-not_reserved{background:#fff4cc} .s-error{background:#f8d0d0} .s-incomplete{background:#e4e4f4}
ul.changes{margin:2px 0;padding-left:16px}
.trend-block{display:inline-block;vertical-align:top;margin:0 18px 18px 0}
.trend-block h3{font-size:14px;margin:4px 0}
"""
)


def _row(cells: list[str], attrs: str = "") -> str:
    return f"<tr{attrs}>" + "".join(cells) + "</tr>"


def _link(href: str | None, text: str) -> str:
    """`text` (already escaped) linked to a relative path, or plain when there is none."""
    if not href:
        return text
    return f'<a href="{escape(quote(href))}">{text}</a>'


def _status_text(host: dict) -> str:
    """`not reserved: <reason>`; only the reason when it already says the status (`held by ci-b/bob`)."""
    status, reason = host["status"].replace("_", " "), host["reason"]
    if not reason:
        return escape(status)
    return escape(reason if reason.lower().startswith(status) else f"{status}: {reason}")


def _verdict_text(host: dict) -> str:
    if host["verdict"] is None:
        return '<span class="muted">no verdict</span>'
    code = "" if host["exit_code"] is None else f" (exit {host['exit_code']})"
    return f"<b>{escape(host['verdict'])}</b>{code}"


def _figure_text(figure: dict | None) -> str:
    if figure is None:
        return ""
    return f'<br><span class="fig">{figure["value"]:.4g} {escape(figure["unit"])}</span>'


def _matrix(fleet: dict) -> str:
    clauses = fleet["clauses"]
    head = (
        '<tr><th class="place">Host</th><th>Verdict</th>'
        + "".join(f'<th title="{escape(c["statement"])}">{escape(c["id"])}</th>' for c in clauses)
        + "</tr>"
    )
    rows = []
    for host in fleet["hosts"]:
        place = _link(host["report"], f"<b>{escape(host['place'])}</b>")
        if host["problem"]:
            place += f'<br><span class="problem">{escape(host["problem"])}</span>'
        cells = [f'<td class="place">{place}</td>', f"<td>{_verdict_text(host)}</td>"]
        if not host["cells"]:
            cells.append(
                f'<td class="s-{escape(host["status"])}" colspan="{max(len(clauses), 1)}">'
                f"{_status_text(host)}</td>"
            )
        else:
            for clause in clauses:
                cell = host["cells"].get(clause["id"])
                if cell is None:
                    cells.append('<td class="muted">—</td>')
                    continue
                figure = cell["figure"]
                title = f"{clause['id']}: {cell['verdict']}" + (
                    f"; key figure {figure['key']} ({figure['stat']})" if figure else ""
                )
                cells.append(
                    f'<td class="v-{escape(cell["verdict"])}" title="{escape(title)}">'
                    f"{escape(cell['verdict'])}{_figure_text(figure)}</td>"
                )
        rows.append(_row(cells, f' data-place="{escape(host["place"])}"'))
    return f'<div class="scroll"><table id="matrix">{head}{"".join(rows)}</table></div>'


def _models(host: dict) -> tuple[str, str]:
    """The device models and the links seen, as two cells' HTML."""
    if not host["devices"]:
        return '<span class="muted">—</span>', '<span class="muted">—</span>'
    models, links = [], []
    for model in host["devices"]:
        resource = f" {escape(model['resource'])}" if model["resource"] else ""
        firmware = f", firmware {escape(', '.join(model['firmware']))}" if model["firmware"] else ""
        models.append(
            f"<code>{escape(model['ids'])}</code>{resource} <span class='muted'>(subsystem "
            f"{escape(model['subsystem'])}, class {escape(str(model['class_code']))}, at "
            f"{escape(', '.join(model['bdfs']))}{firmware})</span>"
        )
        links.append(f"<code>{escape(model['ids'])}</code>: {escape('; '.join(model['links']) or '—')}")
    return "<br>".join(models), "<br>".join(links)


def _hosts(fleet: dict) -> str:
    head = (
        "<tr><th>Host</th><th>Status</th><th>Verdict</th><th>Host under test</th><th>Device models</th>"
        "<th>Link</th><th>Run folder</th></tr>"
    )
    rows = []
    for host in fleet["hosts"]:
        under_test = host["host"] or {}
        described = escape(str(under_test.get("description") or under_test.get("spec") or "—"))
        models, links = _models(host)
        folder = _link(host["report"], escape(host["run_dir"])) if host["run_dir"] else "—"
        rows.append(
            _row(
                [
                    f"<td><b>{escape(host['place'])}</b></td>",
                    f'<td class="s-{escape(host["status"])}">{_status_text(host)}</td>',
                    f"<td>{_verdict_text(host)}</td>",
                    f"<td>{described}</td>",
                    f"<td>{models}</td>",
                    f"<td>{links}</td>",
                    f"<td>{folder}</td>",
                ]
            )
        )
    return f'<table id="hosts">{head}{"".join(rows)}</table>'


def _night_cell(host: dict | None) -> str:
    if host is None:
        return '<td class="muted">not in this night</td>'
    if host["verdict"] is not None:
        top = _link(host["report"], _verdict_text(host))
        css = f"v-{escape(host['verdict'])}"
    else:
        top, css = _status_text(host), f"s-{escape(host['status'])}"
    if host["changes"]:
        items = "".join(
            f"<li>{escape(c['clause'])}: {escape(str(c['before'] or 'absent'))} → "
            f"{escape(str(c['after'] or 'absent'))}</li>"
            for c in host["changes"]
        )
        since = escape(host["compared_with"])
        top += f'<ul class="changes">{items}</ul><span class="muted">since {since}</span>'
    elif host["compared_with"]:
        top += f'<br><span class="muted">no clause changed since {escape(host["compared_with"])}</span>'
    return f'<td class="{css}">{top}</td>'


def _nights(fleet: dict) -> str:
    nights = fleet["nights"]
    places = [h["place"] for h in fleet["hosts"]]
    places += sorted({h["place"] for n in nights for h in n["hosts"]} - set(places))
    head = (
        "<tr><th>Host</th>"
        + "".join(
            f'<th title="coordinator {escape(n["coordinator"])}, folder {escape(n["night_dir"])}">'
            f"{escape(n['started'])}</th>"
            for n in nights
        )
        + "</tr>"
    )
    rows = []
    for place in places:
        cells = [f"<td><b>{escape(place)}</b></td>"]
        for night in nights:
            cells.append(_night_cell(next((h for h in night["hosts"] if h["place"] == place), None)))
        rows.append(_row(cells))
    return f'<div class="scroll"><table id="nights">{head}{"".join(rows)}</table></div>'


def _night_labels(fleet: dict) -> list[str]:
    """x-axis labels of the trends, oldest first: the date, or date and time when dates repeat."""
    started = [n["started"] for n in reversed(fleet["nights"])]
    dates = [s[:10] for s in started]
    return dates if len(set(dates)) == len(dates) else [s[5:16].replace("T", " ") for s in started]


def _trends(fleet: dict) -> str:
    if not fleet["trends"]:
        return '<p class="muted">No clause has a measured figure in these nights.</p>'
    labels = _night_labels(fleet)
    blocks = []
    for trend in fleet["trends"]:
        keys = {s["key"] for s in trend["series"]}
        one_key = len(keys) == 1
        series = [
            (s["place"] if one_key else f"{s['place']}: {s['key']}", [p["value"] for p in s["points"]])
            for s in trend["series"]
        ]
        unit = " / ".join(sorted({s["unit"] for s in trend["series"]}))
        figure_name = next(iter(keys)).removeprefix(f"{trend['clause']} ")
        caption = f"{figure_name} (median)" if one_key else "each host's key figure (median)"
        blocks.append(
            f'<div class="trend-block" data-clause="{escape(trend["clause"])}"><h3>{escape(trend["clause"])} '
            f'{escape(trend["statement"])}</h3><p class="muted">{escape(caption)}</p>'
            f"{svg_plots.trend(series, labels, unit)}</div>"
        )
    return "".join(blocks)


def _summary(fleet: dict) -> str:
    newest = fleet["nights"][0]
    counts: dict[str, int] = {}
    for host in fleet["hosts"]:
        shown = host["verdict"] if host["verdict"] is not None else host["status"].replace("_", " ")
        counts[shown] = counts.get(shown, 0) + 1
    tags = ", ".join(f"{k}={v}" for k, v in sorted(newest["tags"].items())) or "none"
    tally = ", ".join(f"{escape(k)}: {v}" for k, v in sorted(counts.items())) or "no host"
    return (
        f'<p class="muted">night {escape(newest["started"])} to {escape(newest["ended"])}, coordinator '
        f"{escape(newest['coordinator'])}, place tags {escape(tags)}; {len(fleet['nights'])} night(s) "
        f"in this report</p><p id='tally'>{len(fleet['hosts'])} host(s): {tally}</p>"
    )


def render(fleet: dict) -> str:
    """The page for a fleet.json content (reports/fleet.py's build_fleet)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>hilconform fleet report: night of {escape(fleet["newest_night"])}</title>
<style>{STYLE}</style></head>
<body>
<h1>hilconform fleet report</h1>
{_summary(fleet)}
<h2>Hosts × clauses, newest night</h2>
<p class="muted">Each cell: the clause's verdict and its key figure (the median of the clause's first figure
by key; hover for its name). A host without a certificate shows what happened to it instead. A host's
name links to its report.</p>
{_matrix(fleet)}
<h2>Hosts</h2>
{_hosts(fleet)}
<h2>Nights, newest first</h2>
<p class="muted">Each host's verdict per night, and every clause verdict that changed since its previous night
with a certificate.</p>
{_nights(fleet)}
<h2>Key figures over the nights</h2>
{_trends(fleet)}
</body></html>
"""
