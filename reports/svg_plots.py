"""Inline SVG drawings for report.html (a figure's distribution, a per-device lifecycle timeline) and
fleet.html (a key figure's trend over nights, one line per host).

Plain SVG text, drawn here, so the report opens offline with no library.
"""

from __future__ import annotations

import math
from html import escape

# Fill colour of each health/main state on the timeline; unknown states are grey.
STATE_COLOURS = {
    "DISCOVERED": "#9ecae1",
    "HEALTHY": "#41ab5d",
    "ALLOCATED": "#3182bd",
    "RELEASED": "#6baed6",
    "DEGRADED": "#fdae6b",
    "FAULTED": "#e6550d",
    "REMOVED": "#969696",
    "ERROR": "#a50f15",
}
OTHER_COLOUR = "#bdbdbd"


def _scale(lo: float, hi: float, x0: float, x1: float):
    span = (hi - lo) or 1.0
    return lambda v: x0 + (v - lo) / span * (x1 - x0)


def distribution(
    values: list[float],
    unit: str,
    budget: float | None,
    budget_stat: str | None,
    median: float,
    p95: float,
    width: int = 560,
    height: int = 70,
) -> str:
    """Every sample as a dot, a box from median to p95, whiskers min–max, and the budget as a red line."""
    lo = min([*values, 0.0])
    hi = max([*values, budget or 0.0]) * 1.05 or 1.0
    x = _scale(lo, hi, 20, width - 20)
    mid = 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dist" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="distribution">',
        f'<line x1="{x(min(values)):.1f}" x2="{x(max(values)):.1f}" y1="{mid}" y2="{mid}" stroke="#555"/>',
        f'<rect x="{x(median):.1f}" y="{mid - 10}" width="{max(x(p95) - x(median), 1):.1f}" height="20" '
        'fill="#c6dbef" stroke="#3182bd"><title>median to p95</title></rect>',
        f'<line x1="{x(median):.1f}" x2="{x(median):.1f}" y1="{mid - 12}" y2="{mid + 12}" '
        'stroke="#08519c" stroke-width="2"/>',
    ]
    for i, value in enumerate(values):
        jitter = (i * 7) % 13 - 6
        parts.append(
            f'<circle cx="{x(value):.1f}" cy="{mid + jitter}" r="2.5" fill="#08306b" '
            f'fill-opacity="0.6"><title>{value:g} {escape(unit)}</title></circle>'
        )
    if budget is not None:
        parts.append(
            f'<line x1="{x(budget):.1f}" x2="{x(budget):.1f}" y1="8" y2="{mid + 18}" stroke="#d62728" '
            f'stroke-width="2" stroke-dasharray="4 2"><title>budget ({escape(str(budget_stat))}) '
            f"{budget:g} {escape(unit)}</title></line>"
        )
    for tick in _ticks(lo, hi):
        parts.append(
            f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{mid + 20}" y2="{mid + 24}" stroke="#777"/>'
            f'<text x="{x(tick):.1f}" y="{mid + 36}" font-size="10" text-anchor="middle">{tick:g}</text>'
        )
    parts.append(
        f'<text x="{width - 20}" y="{mid + 36}" font-size="10" text-anchor="end" dy="12">'
        f"{escape(unit)}</text></svg>"
    )
    return "".join(parts)


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    raw = (hi - lo) / count or 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    start = (lo // step) * step
    return [round(start + i * step, 10) for i in range(count + 2) if start + i * step <= hi]


def timeline(
    rows: list[tuple[str, list[tuple[float, float, str]], list[tuple[float, str]]]],
    end_s: float,
    width: int = 900,
    row_height: int = 18,
) -> str:
    """One row per device: (label, [(start_s, end_s, state)], [(at_s, marker)]), seconds from run start."""
    label_w = 230
    x = _scale(0.0, end_s or 1.0, label_w, width - 10)
    height = row_height * len(rows) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="device lifecycle timeline">'
    ]
    for i, (label, segments, markers) in enumerate(rows):
        y = i * row_height + 4
        parts.append(f'<text x="4" y="{y + 12}" font-size="11">{escape(label)}</text>')
        for start, stop, state in segments:
            colour = STATE_COLOURS.get(state, OTHER_COLOUR)
            parts.append(
                f'<rect x="{x(start):.1f}" y="{y}" width="{max(x(stop) - x(start), 1.5):.1f}" '
                f'height="{row_height - 4}" fill="{colour}"><title>{escape(state)} '
                f"{start:.2f}–{stop:.2f} s</title></rect>"
            )
        for at, text in markers:
            parts.append(
                f'<path d="M{x(at):.1f} {y} l4 -4 l-8 0 z" fill="#000"><title>{escape(text)} at '
                f"{at:.2f} s</title></path>"
            )
    axis_y = len(rows) * row_height + 8
    for tick in _ticks(0.0, end_s or 1.0, 8):
        parts.append(
            f'<text x="{x(tick):.1f}" y="{axis_y + 12}" font-size="10" text-anchor="middle">{tick:g} s</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


# Line colours of a trend's series, in turn (colour-blind-safe, Okabe-Ito).
SERIES_COLOURS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442"]


def trend(
    series: list[tuple[str, list[float | None]]],
    x_labels: list[str],
    unit: str,
    width: int = 560,
    plot_height: int = 100,
) -> str:
    """One line per series over the x positions (nights, oldest left): (label, [value or None per x]).

    A None is a night without the figure: the line breaks there rather than bridging it, so a
    gap is visible. Every point carries a tooltip with its value; the legend names each line.
    """
    left, right, top, plot_h = 56, 12, 10, plot_height
    height = top + plot_h + 26 + 12 * math.ceil(len(series) / 2)
    values = [v for _label, points in series for v in points if v is not None]
    lo = min([*values, 0.0])
    hi = max([*values, 0.0])
    hi = hi + (hi - lo) * 0.1 or 1.0
    y = _scale(lo, hi, top + plot_h, top)
    count = max(len(x_labels), 1)
    step = (width - left - right) / count
    x = [left + step * (i + 0.5) for i in range(count)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="trend" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="trend in {escape(unit)}">',
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#777"/>',
        f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#777"/>',
    ]
    for tick in _ticks(lo, hi, 4):
        parts.append(
            f'<line x1="{left - 4}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'stroke="#eee"/><text x="{left - 6}" y="{y(tick) + 3:.1f}" font-size="10" '
            f'text-anchor="end">{tick:g}</text>'
        )
    parts.append(f'<text x="4" y="{top + plot_h + 14}" font-size="10">{escape(unit)}</text>')
    every = math.ceil(count / 8)  # at most about 8 night labels, the newest always
    for i, label in enumerate(x_labels):
        if i % every and i != count - 1:
            continue
        parts.append(
            f'<text x="{x[i]:.1f}" y="{top + plot_h + 14}" font-size="10" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    for n, (label, points) in enumerate(series):
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)]
        run: list[str] = []
        for i, value in enumerate([*points, None]):
            if value is not None and i < count:
                run.append(f"{x[i]:.1f},{y(value):.1f}")
                continue
            if len(run) > 1:
                parts.append(
                    f'<polyline points="{" ".join(run)}" fill="none" stroke="{colour}" stroke-width="2"/>'
                )
            run = []
        for i, value in enumerate(points[:count]):
            if value is None:
                continue
            parts.append(
                f'<circle cx="{x[i]:.1f}" cy="{y(value):.1f}" r="3.5" fill="{colour}"><title>'
                f"{escape(label)}, {escape(x_labels[i])}: {value:g} {escape(unit)}</title></circle>"
            )
        legend_y = top + plot_h + 32 + 12 * (n // 2)
        legend_x = left + (n % 2) * (width - left) / 2
        parts.append(
            f'<rect x="{legend_x:.1f}" y="{legend_y - 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{legend_x + 14:.1f}" y="{legend_y + 1}" font-size="10">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
