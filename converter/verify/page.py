"""The forward check's Report rendered as one self-contained HTML page."""

from __future__ import annotations

import html
import math

from ..results import Verdict
from .report import COLUMNS, WEIGHT_COLUMNS, Report, _rows, _weight_rows, summary_lines


def render_html(report: Report) -> str:
    """A self-contained page of the forward check alone (see converter.report for the composed one)."""
    return html_page(report.verdict, html_body(report))


def html_body(report: Report, label: str = "") -> str:
    """What the page shows of the forward check: an inline SVG plot of error and budget against
    depth (log scale), the diagnosis, the summary, the loaded weights that differ, and the table."""
    finite = lambda v: v is not None and math.isfinite(v) and v > 0
    pts = [(i, r) for i, r in enumerate(report.layers) if finite(r.local_max_abs) and finite(r.budget)]
    w, h, pad = 900, 320, 50
    values = [v for _, r in pts for v in (r.local_max_abs, r.budget)]
    lo = math.floor(math.log10(min(values))) if values else -8
    hi = math.ceil(math.log10(max(values))) if values else 0
    hi = max(hi, lo + 1)
    n = max(len(report.layers) - 1, 1)
    x = lambda i: pad + (w - 2 * pad) * i / n
    y = lambda v: h - pad - (h - 2 * pad) * (math.log10(max(v, 10.0 ** lo)) - lo) / (hi - lo)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" style="background:#fff">']
    for e in range(lo, hi + 1):
        svg.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y(10.0 ** e):.1f}" y2="{y(10.0 ** e):.1f}" stroke="#eee"/>'
                   f'<text x="4" y="{y(10.0 ** e) + 4:.1f}" font-size="11">1e{e}</text>')
    for key, color in (("budget", "#2a7"), ("local_max_abs", "#c33")):
        line = " ".join(f"{x(i):.1f},{y(getattr(r, key)):.1f}" for i, r in pts if getattr(r, key))
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{line}"/>')
    if any(r is report.first_bad for _, r in pts):
        i = report.layers.index(report.first_bad)
        svg.append(f'<circle cx="{x(i):.1f}" cy="{y(report.first_bad.local_max_abs):.1f}" r="6" fill="none" stroke="#000"/>')
    svg.append(f'<text x="{pad}" y="{h - 12}" font-size="12">layer (execution order) &#8594;   '
               '<tspan fill="#c33">local error</tspan>  <tspan fill="#2a7">budget</tspan></text></svg>')
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr{}>{}</tr>".format(' class="bad"' if row[0].startswith(">>") else "",
                                           "".join(f"<td>{html.escape(str(c))}</td>" for c in row))
                   for row in _rows(report))
    diag = "".join(f"<li><b>{html.escape(d.layer)}</b>: {html.escape(d.cause)}<br><i>{html.escape(d.hint)}</i></li>"
                   for d in report.diagnosis)
    text = html.escape("\n".join(summary_lines(report, label)))
    weights = ""
    if report.weights_differ:
        cells = lambda row, tag: "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in row)
        weights = (f"<h2>Loaded weights that differ from torch's under mapping "
                   f"'{html.escape(report.weights.mapping)}'</h2><table><tr>{cells(WEIGHT_COLUMNS, 'th')}</tr>"
                   + "".join(f"<tr>{cells(row, 'td')}</tr>" for row in _weight_rows(report.weights)) + "</table>")
    return f"{''.join(svg)}<ul>{diag}</ul><pre>{text}</pre>{weights}<table><tr>{head}</tr>{body}</table>"


def html_page(verdict: Verdict, body: str, headline: str = "") -> str:
    """The page around the sections: its style, the verdict as its heading and `headline`, the
    composed verdict's line, under it."""
    said = f"<p><b>{html.escape(headline)}</b></p>" if headline else ""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>verify-port report</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,td:nth-child(2){text-align:left}"
            "tr.bad{background:#fdd}</style></head><body>"
            f"<h1>verify-port: {verdict.upper()}</h1>{said}{body}</body></html>\n")
