"""The forward check's Report rendered as one self-contained HTML page: the verdict and its
diagnosis first, then each layer's ratio to its budget plotted against the line at 1 (an inline
SVG whose points name their layer on hover), the layers closest to their budget, and every layer
in execution order, folded. No script and no link: the file opens offline. Every string a model
or a report supplies (layer names, types, notes, causes, hints) is escaped."""

from __future__ import annotations

import html
import math

from ..results import Verdict
from .report import WEIGHT_COLUMNS, LayerResult, Report, _num, _weight_rows, summary_lines, verdict_line

CLOSE, HALF = 0.8, 0.5  # a clean layer above CLOSE of its budget is close to it; above HALF, past half of it
CLOSEST_SHOWN, CLOSEST_MOST = 10, 60  # the closest table: at least this many rows, every one past half, at most
DECADES = 10  # the plot spans at most this many decades below its top; a smaller ratio sits on its floor

STATUS = {"over": "over budget", "close": f"close: above {CLOSE:g} of its budget",
          "half": f"above {HALF:g} of its budget", "within": "within budget", "unjudged": "not judged"}
COLORS = {"over": "#c0392b", "close": "#e67e22", "half": "#d4ac0d", "within": "#4a78a8", "unjudged": "#999"}
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}"
         "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         "td:first-child,td:nth-child(2),td.name,td.text{text-align:left}td.name{font-family:monospace}"
         "tr.over{background:#f8c9c4}tr.close{background:#fbd9b0}tr.half{background:#fcf0c0}"
         "tr.unjudged{color:#777}tr.first td.name{font-weight:bold}"
         "p.verdict{font-size:1.1em}.verdict-pass{color:#1e7b34}.verdict-fail{color:#b03a2e}"
         "ul.diagnosis li{margin:.4em 0}pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}"
         "details summary{cursor:pointer;font-weight:bold;margin:.5em 0}svg{max-width:100%;height:auto}")


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def render_html(report: Report) -> str:
    """A self-contained page of the forward check alone (converter.report.render_html composes it
    with the training checks' section)."""
    failed = report.diagnosis if report.verdict is Verdict.FAIL else []  # what the text report prints
    return html_page(report.verdict, html_lead(verdict_line(report), failed), html_body(report))


def html_lead(line: str, diagnosis: list) -> str:
    """The page's first section: the verdict line and, under it, each cause with its hint."""
    kind = "pass" if line.startswith("PASS") else "fail"
    items = "".join(f"<li><b>{esc(d.layer)}</b>: {esc(d.cause)}" + (f"<br><i>hint: {esc(d.hint)}</i>" if d.hint else "")
                    + "</li>" for d in diagnosis)
    return (f'<section id="verdict"><p class="verdict verdict-{kind}"><b>{esc(line)}</b></p>'
            + (f'<ul class="diagnosis">{items}</ul>' if items else "") + "</section>")


def html_page(verdict: Verdict, lead: str, body: str) -> str:
    """The page around the sections: its style, the verdict as its heading, `lead` (from html_lead)
    under it, then `body`."""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>verify-port report: "
            f"{esc(verdict.upper())}</title><style>{STYLE}</style></head><body>"
            f"<h1>verify-port: {esc(verdict.upper())}</h1>{lead}\n{body}</body></html>\n")


def html_body(report: Report, label: str = "") -> str:
    """The forward check's section: its summary (the text report's), the plot of every layer's
    ratio, the layers closest to their budget, the loaded weights that differ, and every layer in
    execution order, folded."""
    return "\n".join([f"<section id=\"forward\"><h2>Forward check: {esc(report.verdict.upper())}</h2>",
                      f"<pre>{esc(chr(10).join(summary_lines(report, label)))}</pre>", ratio_plot(report),
                      closest_table(report), _weights(report), full_table(report), "</section>"])


def status(r: LayerResult) -> str:
    """The row's band: over its budget (NaN included), close to it, past half of it, within it, or not judged."""
    if r.verdict is Verdict.NOT_JUDGED:
        return "unjudged"
    if r.verdict is Verdict.FAIL:
        return "over"
    return "close" if r.ratio > CLOSE else "half" if r.ratio > HALF else "within"


def _ratio(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isnan(x):
        return "nan"
    return "inf" if math.isinf(x) else f"{x:.3g}"


def _name(r: LayerResult) -> str:
    name = r.torch or "<model>"
    return name if r.paddle == r.torch else f"{name} ~ paddle {r.paddle or '<model>'}"


def _where(r: LayerResult, report: Report) -> str:
    """A point's hover text: the layer, its type, its ratio and its band."""
    first = "; the first layer over budget" if r is report.first_bad else ""
    return f"{_name(r)} ({r.type}): ratio {_ratio(r.ratio)}, {STATUS[status(r)]}{first}"


def ratio_plot(report: Report) -> str:
    """Each judged layer's ratio against its position in execution order, on a log scale, with the
    line at 1 and the bands of layers close to it; a point's <title> names its layer. Ratios of 0 and
    those under the scale sit hollow in the strip under it and on its floor, NaN and infinite ones
    in the strip above it."""
    judged = [(i, r) for i, r in enumerate(report.layers) if r.ratio is not None]
    if not judged:
        return f"<p>No layer's ratio to a budget to plot ({len(report.layers)} layer(s), none judged).</p>"
    shown = [r.ratio for _, r in judged if math.isfinite(r.ratio) and r.ratio > 0]
    hi = max(1, math.ceil(math.log10(max(shown)))) if shown else 1
    lo = min(-1, math.floor(math.log10(min(shown)))) if shown else -1
    lo = max(lo, hi - DECADES)
    w, h, left, right, top, bottom = 960, 350, 56, 16, 30, 54
    n = max(len(report.layers) - 1, 1)
    x = lambda i: left + (w - left - right) * i / n
    y = lambda v: top + (h - top - bottom) * (hi - min(max(math.log10(v), lo), hi)) / (hi - lo)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           f'role="img" aria-label="ratio of each layer\'s error to its budget, log scale" font-family="sans-serif" '
           'style="background:#fff">']
    for start, end, fill, said in ((HALF, CLOSE, "#fcf0c0", STATUS["half"]), (CLOSE, 1, "#fbd9b0", STATUS["close"])):
        svg.append(f'<rect x="{left}" y="{y(end):.1f}" width="{w - left - right}" height="{y(start) - y(end):.1f}" '
                   f'fill="{fill}"><title>{esc(said)}</title></rect>')
    for e in range(lo, hi + 1):
        label = "1" if e == 0 else f"1e{e}"
        svg.append(f'<line x1="{left}" x2="{w - right}" y1="{y(10.0 ** e):.1f}" y2="{y(10.0 ** e):.1f}" '
                   f'stroke="#eee"/><text x="{left - 6}" y="{y(10.0 ** e) + 4:.1f}" font-size="11" '
                   f'text-anchor="end">{label}</text>')
    svg.append(f'<line x1="{left}" x2="{w - right}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#c0392b" '
               f'stroke-width="1.5"><title>ratio 1: the budget</title></line>'
               f'<text x="{w - right}" y="{y(1) - 4:.1f}" font-size="11" text-anchor="end" fill="#c0392b">'
               f'budget (ratio 1)</text>')
    off_scale, zero = top / 2, h - bottom + 14  # the strips above the scale (NaN, inf) and under it (0)
    for i, r in judged:
        band = status(r)
        floored = math.isfinite(r.ratio) and not r.ratio >= 10.0 ** lo  # drawn hollow: not at its height
        cy = (off_scale if not math.isfinite(r.ratio) else zero if r.ratio == 0
              else y(10.0 ** lo) if floored else y(r.ratio))
        radius = 4.5 if band == "over" else 3.5 if band in ("close", "half") else 2.5
        paint = f'fill="none" stroke="{COLORS[band]}"' if floored else f'fill="{COLORS[band]}"'
        svg.append(f'<circle cx="{x(i):.1f}" cy="{cy:.1f}" r="{radius}" {paint} class="{band}">'
                   f'<title>{esc(_where(r, report))}</title></circle>')
    first = next(((i, r) for i, r in judged if r is report.first_bad), None)
    if first is not None:
        i, first = first
        cy = off_scale if not math.isfinite(first.ratio) else y(max(first.ratio, 10.0 ** lo))
        anchor = "end" if x(i) > w / 2 else "start"
        below = cy < top + 20  # a label above a point at the top of the plot would leave it
        svg.append(f'<circle cx="{x(i):.1f}" cy="{cy:.1f}" r="8" fill="none" stroke="#000"/>'
                   f'<text x="{x(i):.1f}" y="{cy + 22 if below else cy - 12:.1f}" font-size="12" '
                   f'text-anchor="{anchor}" stroke="#fff" stroke-width="3" paint-order="stroke">'
                   f'{esc(first.torch or "<model>")}</text>')
    unjudged = len(report.layers) - len(judged)
    svg.append(f'<text x="{left}" y="{h - 12}" font-size="12">layer, in execution order &#8594; (hover a point '
               f'for its name; {len(judged)} plotted, {unjudged} not judged)</text>')
    if any(not math.isfinite(r.ratio) for _, r in judged):
        svg.append(f'<text x="{left - 6}" y="{off_scale + 4:.1f}" font-size="11" text-anchor="end">NaN, inf</text>')
    if any(r.ratio == 0 for _, r in judged):
        svg.append(f'<text x="{left - 6}" y="{zero + 4:.1f}" font-size="11" text-anchor="end">0</text>')
    svg.append("</svg>")
    legend = " ".join(f'<span style="color:{COLORS[k]}">&#9679;</span> {esc(STATUS[k])}'
                      for k in ("over", "close", "half", "within"))
    return (f"<h3>Each layer's error against its budget (ratio, log scale)</h3>{''.join(svg)}"
            f"<p>{legend}</p>")


def _order(r: LayerResult) -> tuple:
    """Sort key, closest first: NaN, then infinite, then the highest ratio."""
    return (0 if math.isnan(r.ratio) else 1, -r.ratio if not math.isnan(r.ratio) else 0.0)


COLUMNS = ("#", "layer", "type", "shape", "max abs", "local err", "budget", "ratio", "status", "note")


def _row(position: int, r: LayerResult, report: Report) -> str:
    band = status(r)
    classes = band + (" first" if r is report.first_bad else "")
    cells = [f"<td>{position}</td>", f'<td class="name">{esc(_name(r))}</td>', f'<td class="text">{esc(r.type)}</td>',
             f"<td>{esc('x'.join(map(str, r.shape)) or '-')}</td>", f"<td>{_num(r.max_abs)}</td>",
             f"<td>{_num(r.local_max_abs)}</td>", f"<td>{_num(r.budget)}</td>", f"<td>{_ratio(r.ratio)}</td>",
             f'<td class="text">{esc(STATUS[band])}{"; first over budget" if r is report.first_bad else ""}</td>',
             f'<td class="text">{esc(r.note)}</td>']
    return f'<tr class="{classes}">{"".join(cells)}</tr>'


def _table(rows: list[str], columns=COLUMNS) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def closest_table(report: Report) -> str:
    """The judged layers closest to their budget, highest ratio first: every one past half of its
    budget and at least CLOSEST_SHOWN, at most CLOSEST_MOST; `#` is the layer's place in execution order."""
    judged = sorted(((i, r) for i, r in enumerate(report.layers) if r.ratio is not None), key=lambda p: _order(p[1]))
    if not judged:
        return "<h3>Closest to their budget</h3><p>No layer was judged against a budget.</p>"
    past_half = sum(1 for _, r in judged if status(r) in ("over", "close", "half"))
    shown = judged[:min(max(CLOSEST_SHOWN, past_half), CLOSEST_MOST)]
    over = sum(1 for _, r in judged if r.verdict is Verdict.FAIL)
    close = sum(1 for _, r in judged if status(r) == "close")
    said = (f"<p>The {len(shown)} of {len(judged)} judged layers closest to their budget, highest ratio first: "
            f"{over} over budget, {close} close (above {CLOSE:g} of it)")
    if past_half > len(shown):
        said += f"; {past_half - len(shown)} more past half of their budget are in the full table below"
    return (f"<h3>Closest to their budget</h3>{said}.</p>"
            + _table([_row(i + 1, r, report) for i, r in shown]))


def full_table(report: Report) -> str:
    """Every layer in execution order, folded under a <details>."""
    rows = [_row(i + 1, r, report) for i, r in enumerate(report.layers)]
    return (f"<details><summary>All {len(rows)} layers in execution order</summary>{_table(rows)}</details>")


def _weights(report: Report) -> str:
    if not report.weights_differ:
        return ""
    rows = ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in _weight_rows(report.weights)]
    return (f"<h3>Loaded weights that differ from torch's under mapping '{esc(report.weights.mapping)}'</h3>"
            + _table(rows, WEIGHT_COLUMNS))
