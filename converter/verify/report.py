"""Results as data: one LayerResult per aligned layer, one Report. Text and JSON are renderings
of the same Report; converter.verify.page renders it as HTML."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field, replace

from ..compare.weights import WeightCheck, WeightDiff
from ..diagnosis import Diagnosis
from ..results import Verdict
from .explanation import Explanation


@dataclass(frozen=True)
class LayerResult:
    torch: str
    paddle: str
    type: str
    paddle_type: str
    shape: tuple
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    cosine: float | None = None
    nan: int = 0
    inf: int = 0
    local_max_abs: float | None = None
    local_mean_abs: float | None = None
    budget: float | None = None
    ratio: float | None = None
    formats: dict = field(default_factory=dict)
    note: str = ""
    worst_index: tuple = ()
    worst_input: str = ""  # set when the ratio is that of an input this layer's own code computed for a child
    # the budget's named terms at the worst element: (term, side, share of the variance), largest first
    terms: tuple = ()
    own_error: dict = field(default_factory=dict)  # side -> its largest error against the float64 reference

    @property
    def verdict(self) -> Verdict:
        return Verdict.of_ratio(self.ratio)

    @property
    def within_budget(self) -> bool | None:
        """The JSON's spelling of the verdict: None where the row was not judged."""
        return None if self.verdict is Verdict.NOT_JUDGED else self.verdict is Verdict.PASS

    def __bool__(self) -> bool:
        return bool(self.verdict)

    def to_json(self) -> dict:
        return {"torch": self.torch, "paddle": self.paddle, "type": self.type, "paddle_type": self.paddle_type,
                "shape": list(self.shape), "max_abs": self.max_abs, "mean_abs": self.mean_abs,
                "max_rel": self.max_rel, "cosine": self.cosine, "nan": self.nan, "inf": self.inf,
                "budget": self.budget, "ratio": self.ratio, "local_max_abs": self.local_max_abs,
                "local_mean_abs": self.local_mean_abs, "local_ratio": self.ratio,
                "within_budget": self.within_budget, "formats": self.formats, "note": self.note,
                "worst_index": list(self.worst_index),
                "budget_terms": [{"term": t, "side": s, "share": f} for t, s, f in self.terms],
                "own_error": dict(self.own_error)}

    @classmethod
    def from_json(cls, body: dict) -> LayerResult:
        """A row read back from its JSON, where a ratio over every budget was written as null."""
        return cls(body["torch"], body["paddle"], body["type"], body["paddle_type"], tuple(body["shape"]),
                   body["max_abs"], body["mean_abs"], body["max_rel"], body["cosine"], body["nan"], body["inf"],
                   body["local_max_abs"], body["local_mean_abs"], body["budget"], _ratio_of(body), body["formats"],
                   body["note"], tuple(body["worst_index"]),
                   terms=tuple((t["term"], t["side"], t["share"]) for t in body.get("budget_terms", ())),
                   own_error=dict(body.get("own_error") or {}))


def _ratio_of(body: dict) -> float | None:
    """A ratio read back: JSON writes an infinite one as null, and the verdict says it failed."""
    ratio = body["ratio"]
    return float("inf") if ratio is None and body["within_budget"] is False else ratio


@dataclass
class Report:
    layers: list[LayerResult]
    first_bad: LayerResult | None
    precision: dict
    diagnosis: list[Diagnosis]
    strategy: str
    passes: int
    notes: list[str] = field(default_factory=list)
    outputs: LayerResult | None = None  # the final outputs, end to end, against their own budget
    weights: WeightCheck | None = None  # with mapping 'loaded': the loaded weights against torch's
    explanation: Explanation | None = None  # why the figures are what they are (explain.py), and a threshold's answer

    @property
    def verdict(self) -> Verdict:
        return Verdict.FAIL if self.first_bad is not None or self.weights_differ else Verdict.PASS

    @property
    def weights_differ(self) -> bool:
        return self.weights is not None and bool(self.weights.differ)

    def __bool__(self) -> bool:
        return bool(self.verdict)

    @property
    def exit_code(self) -> int:
        return 0 if self else 1

    def tightness(self) -> float | None:
        """Median local ratio over layers within budget: how close the budget sits to the noise."""
        ratios = sorted(r.ratio for r in self.layers if r.ratio is not None and r.ratio <= 1.0 and r.ratio > 0)
        return ratios[len(ratios) // 2] if ratios else None

    def to_json(self) -> dict:
        first = None
        if self.first_bad is not None:
            first = {"torch": self.first_bad.torch, "paddle": self.first_bad.paddle,
                     "type": self.first_bad.type, "ratio": self.first_bad.ratio}
        return {"verdict": self.verdict, "first_bad_layer": first, "layers": [r.to_json() for r in self.layers],
                "precision": self.precision, "diagnosis": [d.to_json() for d in self.diagnosis],
                "strategy": self.strategy, "paired_passes": self.passes, "tightness": self.tightness(),
                "notes": self.notes, "outputs": None if self.outputs is None else {
                    "max_abs": self.outputs.max_abs, "budget": self.outputs.budget, "ratio": self.outputs.ratio,
                    "within_budget": self.outputs.within_budget, "note": self.outputs.note},
                "loaded_weights": None if self.weights is None else self.weights.to_json(),
                "explanation": None if self.explanation is None else self.explanation.to_json()}

    @classmethod
    def from_json(cls, body: dict) -> Report:
        """The Report its JSON was written from: rows, the first bad one, the final outputs, the
        diagnosis and the loaded weights' check. What the JSON does not hold stays empty (a row's
        worst_input; the final outputs' names, unless they are the first bad)."""
        layers = [LayerResult.from_json(row) for row in body["layers"]]
        first, said = None, body["first_bad_layer"]
        outputs = None if body["outputs"] is None else LayerResult(
            "", "", "", "", (), body["outputs"]["max_abs"], budget=body["outputs"]["budget"],
            ratio=_ratio_of(body["outputs"]), note=body["outputs"]["note"])
        if said is not None:
            first = next((r for r in layers if r.verdict is Verdict.FAIL and (r.torch, r.paddle, r.type)
                          == (said["torch"], said["paddle"], said["type"])), None)
            if first is None and outputs is not None:  # no layer isolated: the final outputs failed
                outputs = first = replace(outputs, torch=said["torch"], paddle=said["paddle"], type=said["type"])
        loaded = body["loaded_weights"]
        weights = None if loaded is None else WeightCheck(loaded["mapping"], loaded["checked"], [
            WeightDiff(d["paddle"], d["torch"], tuple(d["shape"]), d["differ"], d["size"], d["max_abs"],
                       tuple(d["index"]), d["paddle_value"], d["torch_value"], d["note"]) for d in loaded["differ"]])
        explained = body.get("explanation")
        return cls(layers, first, body["precision"], [Diagnosis.from_json(d) for d in body["diagnosis"]],
                   body["strategy"], body["paired_passes"], body["notes"], outputs, weights,
                   None if explained is None else Explanation.from_json(explained))


def _num(x) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.2e}"


TEXT_WIDTH = 110  # the explanation's lines

COLUMNS = ("layer", "type", "shape", "max abs", "local err", "budget", "ratio")


def _rows(report: Report) -> list[tuple]:
    rows = []
    for r in report.layers:
        mark = ">> " if r is report.first_bad else ("!  " if r.within_budget is False else "   ")
        name = r.torch or "<model>"
        if r.paddle != r.torch:
            name += f" ~ {r.paddle or '<model>'}"
        rows.append((mark + name, r.type, "x".join(map(str, r.shape)) or "-", _num(r.max_abs),
                     _num(r.local_max_abs), _num(r.budget), "-" if r.ratio is None else f"{r.ratio:.3g}"))
    return rows


WEIGHT_COLUMNS = ("paddle weight", "torch", "shape", "differ", "max abs", "at", "paddle", "torch value")


def _value(x: float) -> str:
    return f"{x:.9g}"


def _weight_rows(check: WeightCheck) -> list[tuple]:
    return [(d.paddle, d.torch, "x".join(map(str, d.shape)) or "-", f"{d.differ}/{d.size}", _num(d.max_abs),
             str(list(d.index)), _value(d.paddle_value), _value(d.torch_value)) for d in check.differ]


def weight_lines(report: Report) -> list[str]:
    """The table of loaded weights that differ from torch's (mapping 'loaded'), or none."""
    if not report.weights_differ:
        return []
    check = report.weights
    rows = _weight_rows(check)
    widths = [max(len(WEIGHT_COLUMNS[i]), *(len(row[i]) for row in rows)) for i in range(len(WEIGHT_COLUMNS))]
    widths[0], widths[1] = min(widths[0], 60), min(widths[1], 60)
    fmt = lambda row: "  ".join(str(c)[:widths[i]].ljust(widths[i]) if i < 3 else str(c).rjust(widths[i])
                                for i, c in enumerate(row))
    lines = [f"loaded weights that differ from torch's under mapping '{check.mapping}', bit for bit "
             f"({len(check.differ)} of {check.checked}):", fmt(WEIGHT_COLUMNS),
             "-" * (sum(widths) + 2 * (len(widths) - 1))]
    lines += [fmt(row) + (f"  ({d.note})" if d.note else "") for row, d in zip(rows, check.differ)]
    return lines + [""]


def render_text(report: Report, max_rows: int = 60, label: str = "") -> str:
    """The forward check's table and summary; `label` heads its verdict line where the report's
    own verdict is composed after it (the forward check's, with the training checks')."""
    rows = _rows(report)
    total, left_out = len(rows), ""
    if len(rows) > max_rows:  # keep the first bad layer and its neighbours in view
        idx = report.layers.index(report.first_bad) if report.first_bad in report.layers else 0
        lo = max(0, min(idx - max_rows // 2, len(rows) - max_rows))
        rows = rows[lo:lo + max_rows]
        left_out = (f"(rows {lo + 1} to {lo + len(rows)} of {total} shown; --rows {total} shows all, "
                    "--json and --html hold every row)")
    widths = [max(len(COLUMNS[i]), *(len(row[i]) for row in rows)) if rows else len(COLUMNS[i]) for i in range(len(COLUMNS))]
    widths[0] = min(widths[0], 70)
    fmt = lambda row: "  ".join(str(c)[:widths[i]].ljust(widths[i]) if i < 3 else str(c).rjust(widths[i])
                                for i, c in enumerate(row))
    lines = [fmt(("   " + COLUMNS[0],) + COLUMNS[1:]), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    lines += [fmt(row) for row in rows]
    if left_out:
        lines.append(left_out)
    lines.append("")
    return "\n".join(lines + weight_lines(report) + summary_lines(report, label))


def summary_lines(report: Report, label: str = "") -> list[str]:
    """The forward check's summary, ending with its verdict line (headed by `label` where given)."""
    lines = []
    p = report.precision
    lines.append("precision: torch " + p["torch"]["effective"] + ", paddle " + p["paddle"]["effective"]
                 + f"  (strategy {report.strategy}, {report.passes} paired pass(es))")
    if report.explanation is not None:
        for said in (report.explanation.paragraph(), report.explanation.threshold_words()):
            lines += textwrap.wrap(said, width=TEXT_WIDTH, initial_indent="  ", subsequent_indent="  ",
                                   break_on_hyphens=False) if said else []
    t = report.tightness()
    if t is not None:
        lines.append(f"budget tightness (median local ratio of clean layers): {t:.3f}")
    for note in report.notes:
        lines.append(f"note: {note}")
    if report.outputs is not None and report.outputs.ratio is not None:
        o = report.outputs
        lines.append(f"final outputs: max abs {_num(o.max_abs)} vs end-to-end budget {_num(o.budget)} (ratio {o.ratio:.3g})"
                     if o.max_abs is not None or not o.note else f"final outputs cannot be compared: {o.note}")
    w = report.weights
    if w is not None and not w.differ:
        lines.append(f"loaded weights: all {w.checked} equal to torch's under mapping '{w.mapping}', bit for bit")
    lines.append(label + verdict_line(report))
    if report.verdict is Verdict.PASS:
        return lines
    for d in report.diagnosis:
        lines.append(f"  cause: {d.cause}")
        lines.append(f"  hint:  {d.hint}")
    return lines


def verdict_line(report: Report) -> str:
    """The forward check's verdict in one line: PASS, or FAIL with what failed first."""
    w = report.weights
    if report.first_bad is None and report.weights_differ:
        return (f"FAIL: {len(w.differ)} of {w.checked} loaded paddle weight(s) differ from torch's under mapping "
                f"'{w.mapping}' (see their table); every compared layer is within its expected-error budget")
    if report.first_bad is None:
        return f"PASS: all {len(report.layers)} compared layers are within their expected-error budget"
    if report.first_bad is report.outputs:
        o = report.outputs
        return (f"FAIL: the final outputs differ beyond noise (max abs {_num(o.max_abs)} vs end-to-end budget "
                f"{_num(o.budget)}, ratio {o.ratio:.3g}), and no single layer is over its own budget")
    r = report.first_bad
    if r.local_max_abs is None and r.max_abs is None and r.note:  # the outputs cannot be compared at all
        return (f"FAIL: first layer whose outputs cannot be compared: {r.torch or '<model>'} ({r.type}) ~ "
                f"paddle {r.paddle or '<model>'}: {r.note}")
    return (f"FAIL: first layer over budget: {r.torch or '<model>'} ({r.type}) ~ paddle "
            f"{r.paddle or '<model>'}: local error {_num(r.local_max_abs)} vs budget {_num(r.budget)} "
            f"(ratio {r.ratio:.3g})")
