"""The TrainReport rendered: terminal lines, and an HTML section with both loss curves and the band."""

from __future__ import annotations

import html
import math

from .result import PHASES, TrainReport

PHASE_NAMES = {"structure": "structure", "loss": "loss", "backward": "backward", "lr": "learning rate",
               "optimizer": "optimizer (teacher-forced)", "steps": "free-running steps"}


def _ratio(r) -> str:
    return "-" if r is None else ("inf" if math.isinf(r) else f"{r:.3g}")


def render_text(report: TrainReport) -> str:
    lines = [f"training checks over {len(report.steps)} step(s); paddle's optimizer: {report.optimizer}"]
    lines.append(f"  {'phase':<28} {'verdict':<12} {'checks':>6} {'worst ratio':>11}  where")
    for phase in report.phases:
        worst = phase.worst
        where = "" if worst is None else _where(worst)
        lines.append(f"  {PHASE_NAMES[phase.phase]:<28} {phase.label:<12} {len(phase.rows):>6} "
                     f"{_ratio(None if worst is None else worst.ratio):>11}  {where}")
    if report.steps:
        last = report.steps[-1]
        worst_step = max(report.steps, key=lambda s: s.ratio)
        lines.append(f"  loss at step {last.step}: torch {last.loss_torch:.7g}, paddle {last.loss_paddle:.7g}; "
                     f"largest step difference {abs(worst_step.loss_paddle - worst_step.loss_torch):.3g} at step "
                     f"{worst_step.step} (band {worst_step.band:.3g}, ratio {worst_step.ratio:.3g})")
    fb = report.first_bad
    if fb is not None:
        lines.append(f">> first over budget: {PHASE_NAMES[fb.phase]}{_at_step(fb)}: torch '{fb.torch}' / paddle "
                     f"'{fb.paddle}' (ratio {_ratio(fb.ratio)}{', ' + fb.note if fb.note else ''})")
    for d in report.diagnosis:
        lines.append(f"   diagnosis: {d.layer}: {d.cause}")
        lines.append(f"              hint: {d.hint}")
    for note in report.notes:
        lines.append(f"  note: {note}")
    lines.append(f"training verdict: {report.verdict.upper()}")
    return "\n".join(lines)


def first_bad_line(report: TrainReport) -> str:
    """Where the training checks failed first, in a few words (empty when they pass)."""
    fb = report.first_bad
    if fb is None:
        return ""
    return (f"first over budget: {PHASE_NAMES[fb.phase]}{_at_step(fb)}, torch '{fb.torch}' / paddle '{fb.paddle}', "
            f"ratio {_ratio(fb.ratio)}")


def _at_step(row) -> str:
    return f" at step {row.step}" if row.step is not None else ""


def _where(row) -> str:
    name = row.torch if row.torch == row.paddle else f"{row.torch} / {row.paddle}"
    return f"{name}{_at_step(row)}"


def _polyline(points, color, dash="") -> str:
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{extra} points="{pts}"/>'


def _plot_losses(steps, width=640, height=260, pad=40) -> str:
    """Both loss curves and the band around torch's."""
    lo = min(min(s.loss_torch - s.band, s.loss_paddle) for s in steps)
    hi = max(max(s.loss_torch + s.band, s.loss_paddle) for s in steps)
    hi = hi if hi > lo else lo + 1.0
    n = max(len(steps) - 1, 1)
    x = lambda k: pad + (width - 2 * pad) * k / n
    y = lambda v: height - pad - (height - 2 * pad) * (v - lo) / (hi - lo)
    upper = [(x(s.step), y(s.loss_torch + s.band)) for s in steps]
    lower = [(x(s.step), y(s.loss_torch - s.band)) for s in reversed(steps)]
    band = " ".join(f"{a:.1f},{b:.1f}" for a, b in upper + lower)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            f'<polygon fill="#9ecae1" opacity="0.5" points="{band}"/>'
            + _polyline([(x(s.step), y(s.loss_torch)) for s in steps], "#08519c")
            + _polyline([(x(s.step), y(s.loss_paddle)) for s in steps], "#d94801", "4,3")
            + f'<text x="{pad}" y="16" font-size="12">loss per step: torch (solid), paddle (dashed), band '
              f'around torch (shaded); {lo:.4g} .. {hi:.4g}</text></svg>')


def _plot_gap(steps, width=640, height=200, pad=40) -> str:
    """|paddle - torch| against the band, log scale: where the band is too thin to see above."""
    vals = [v for s in steps for v in (abs(s.loss_paddle - s.loss_torch), s.band) if v > 0 and math.isfinite(v)]
    if not vals:
        return ""
    lo, hi = math.log10(min(vals)) - 0.5, math.log10(max(vals)) + 0.5
    n = max(len(steps) - 1, 1)
    x = lambda k: pad + (width - 2 * pad) * k / n
    y = lambda v: height - pad - (height - 2 * pad) * (math.log10(max(v, 10 ** lo)) - lo) / (hi - lo)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            + _polyline([(x(s.step), y(s.band)) for s in steps], "#08519c")
            + _polyline([(x(s.step), y(abs(s.loss_paddle - s.loss_torch))) for s in steps], "#d94801", "4,3")
            + f'<text x="{pad}" y="16" font-size="12">|loss paddle - loss torch| (dashed) against the band '
              f'(solid), log scale 1e{lo:.1f} .. 1e{hi:.1f}</text></svg>')


def render_html_section(report: TrainReport) -> str:
    e = html.escape
    parts = [f"<h2>Training checks: {e(report.verdict.upper())}</h2>",
             f"<p>paddle's optimizer: <code>{e(report.optimizer)}</code></p>"]
    if report.steps:
        parts += [_plot_losses(report.steps), _plot_gap(report.steps)]
    fb = report.first_bad
    if fb is not None:
        parts.append(f"<p><b>first over budget</b>: {e(PHASE_NAMES[fb.phase])}{e(_at_step(fb))}: torch "
                     f"<code>{e(fb.torch)}</code>, paddle <code>{e(fb.paddle)}</code>, ratio {e(_ratio(fb.ratio))}</p>")
    for d in report.diagnosis:
        parts.append(f"<p><b>{e(d.layer)}</b>: {e(d.cause)}<br><i>{e(d.hint)}</i></p>")
    shown = _shown_rows(report)
    if len(shown) < len(report.rows):
        parts.append(f"<p>{len(report.rows)} checks; the table shows the {len(shown)} over budget or worst in "
                     "their phase (the JSON report holds every check)</p>")
    parts.append("<table border=1 cellspacing=0><tr><th>phase</th><th>step</th><th>torch</th><th>paddle</th>"
                 "<th>max abs</th><th>budget</th><th>ratio</th><th>note</th></tr>")
    for r in shown:
        style = ' style="background:#fcc"' if r.bad else ""
        parts.append(f"<tr{style}><td>{e(r.phase)}</td><td>{'' if r.step is None else r.step}</td>"
                     f"<td>{e(r.torch)}</td><td>{e(r.paddle)}</td><td>{_num(r.max_abs)}</td><td>{_num(r.budget)}</td>"
                     f"<td>{e(_ratio(r.ratio))}</td><td>{e(r.note)}</td></tr>")
    parts.append("</table>")
    parts += [f"<p>{e(n)}</p>" for n in report.notes]
    return "\n".join(parts)


SHOWN_CHECKS = 60  # a table of more checks than this shows those over budget and each phase's worst


def _shown_rows(report: TrainReport) -> list:
    """The rows of the HTML table, in their order: all of them when few, else the first-bad row,
    every row over budget and the worst row of each phase."""
    if len(report.rows) <= SHOWN_CHECKS:
        return list(report.rows)
    keep = {id(r) for r in report.rows if r.bad}
    keep |= {id(row) for row in map(report.worst, PHASES) if row is not None}
    if report.first_bad is not None:
        keep.add(id(report.first_bad))
    return [r for r in report.rows if id(r) in keep]


def _num(v) -> str:
    return "" if v is None else f"{v:.3g}"
