"""Why the figures are what they are: a short paragraph for the final outputs and the layers with
the largest local error. For each: the difference on the same inputs, each side's error against the
float64 reference, the budget's largest terms in words; where a side computes in TF32, bf16 or fp16
(recorded or emulated), what the same layer gives with every side in fp32 (measured: both layers
re-run so) and the settings that turn the format off on each side. A threshold the user holds (as
reprod_log's 1e-5) is answered: where the arithmetic each side used cannot hold it (the budget
exceeds it, and why) and whether the run's errors are within it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..compare.budget_terms import INPUT_ROUNDING, STORED_FORMAT
from ..paths import is_under
from .explanation import OUTPUTS, Explanation, Item, settings_of
from .report import LayerResult, Report

from ..compare.port import Session

EXPLAINED_LAYERS = 2  # the layers with the largest local error that the paragraph explains
SECOND_SHARE = 0.1  # ... those at least this share of the largest one's


def explained(session: Session, report: Report, threshold: float | None = None) -> Report:
    """`report` with its Explanation: the rows chosen, measured again in fp32 where a side used
    another format (session: the run's, still open)."""
    formats = {side: p["effective"] for side, p in report.precision.items()}
    emulated = {side: p["emulated"] for side, p in report.precision.items() if p.get("emulated")}
    chosen = _largest(report.layers)
    outputs = [report.outputs] if report.outputs is not None and report.outputs.ratio is not None else []
    rows = chosen + [r for r in outputs if r.max_abs is not None]
    fp32 = _fp32_differences(session, chosen, report.outputs) if set(formats.values()) != {"fp32"} else {}
    items = tuple(_item(r, formats, fp32, r is report.outputs) for r in rows)
    judged = [r for r in report.layers if r.ratio is not None] + outputs
    cannot, exceeded = (), ()
    if threshold is not None:
        name = lambda r: OUTPUTS if r is report.outputs else _name(r)
        cannot = tuple(sorted(((name(r), r.budget) for r in judged if r.budget is not None and r.budget > threshold),
                              key=lambda x: -x[1]))
        exceeded = tuple((name(r), d) for r in judged for d in [_difference(r, r is report.outputs)]
                         if d is not None and d > threshold)
    explanation = Explanation(formats, emulated, items, settings_of(report.precision), threshold, cannot, exceeded,
                              len(judged))
    return replace(report, explanation=explanation)


def _largest(layers: list[LayerResult]) -> list[LayerResult]:
    """The judged layers (the model itself aside) with the largest local error (those within a
    factor 1 / SECOND_SHARE of the largest), the deepest first: a layer holding one explained is not
    explained again (a wrapper and what it returns)."""
    rows = [r for r in layers if r.torch and r.ratio is not None and r.local_max_abs and math.isfinite(r.local_max_abs)]
    rows.sort(key=lambda r: (-r.local_max_abs, -r.torch.count(".")))
    out, seen = [], set()
    for r in rows:
        if out and r.local_max_abs < SECOND_SHARE * out[0].local_max_abs:
            break
        if (r.local_max_abs, r.budget) not in seen and not any(is_under(o.torch, r.torch) for o in out):
            seen.add((r.local_max_abs, r.budget))
            out.append(r)
        if len(out) == EXPLAINED_LAYERS:
            break
    return out


def _name(r: LayerResult) -> str:
    return f"{r.torch or '<model>'} ({r.type})"


def _difference(r: LayerResult, outputs: bool) -> float | None:
    return r.max_abs if outputs else r.local_max_abs


def _item(r: LayerResult, formats: dict, fp32: dict, outputs: bool) -> Item:
    lower = [side for side, fmt in formats.items() if fmt != "fp32"]
    share = sum(f for t, s, f in r.terms if s in lower and (t == INPUT_ROUNDING or
                                                             (t == STORED_FORMAT and formats[s] in ("bf16", "fp16"))))
    fp32_budget = r.budget * math.sqrt(max(1.0 - share, 0.0)) if lower and r.budget is not None and r.terms else None
    measured = fp32.get("" if outputs else r.torch)
    return Item(OUTPUTS if outputs else _name(r), _difference(r, outputs), r.mean_abs if outputs else r.local_mean_abs,
                r.budget, dict(r.own_error), tuple(r.terms), None if isinstance(measured, str) else measured,
                fp32_budget, measured if isinstance(measured, str) else "")


def _fp32_differences(session: Session, chosen: list[LayerResult], outputs: LayerResult | None) -> dict:
    """With every side in fp32 (--emulate's rounding and TF32 off): per chosen layer (torch path),
    the largest difference of the paddle layer re-run on torch's recorded inputs from torch's
    output, and under "" the final outputs' largest difference, free-running; where one could not
    be measured, why (a string)."""
    from ..compare.capture import capture_paddle, capture_torch, is_first_call
    from ..compare.precision import fp32_arithmetic
    from ..compare.replay import forced_paddle_inputs, run_paddle, to_numpy_list
    out = {r.torch: "not measured (a later call of its module)" for r in chosen
           if not (is_first_call(r.torch) and is_first_call(r.paddle))}
    layers = [r for r in chosen if r.torch not in out]
    if not layers and outputs is None:
        return out
    with session.training(), fp32_arithmetic():  # the session as the training checks run it: --emulate's rounding off
        t_rec = capture_torch(session, {r.torch for r in layers} | {""})
        p_rec = capture_paddle(session, {r.paddle for r in layers} | {""})
        for r in layers:
            t_call, p_call = t_rec.calls.get(r.torch), p_rec.calls.get(r.paddle)
            if t_call is None or p_call is None:
                out[r.torch] = "not measured (the fp32 forward did not call it)"
                continue
            try:
                p_out = run_paddle(session.paddle_layer(r.paddle), *forced_paddle_inputs(t_call, p_call))
            except Exception as exc:  # the layer refuses torch's inputs (it was judged by what it adds): said so
                out[r.torch] = f"not measured (paddle's layer does not run on torch's inputs: {type(exc).__name__})"
                continue
            out[r.torch] = _largest_difference(to_numpy_list(t_call.outputs, "torch"), p_out, by_value=True)
        t_root, p_root = t_rec.calls.get(""), p_rec.calls.get("")
        if outputs is not None and t_root is not None and p_root is not None:
            out[""] = _largest_difference(to_numpy_list(t_root.outputs, "torch"), to_numpy_list(p_root.outputs, "paddle"),
                                          by_value=False)
    return {k: "not measured (its outputs do not pair)" if v is None else v for k, v in out.items()}


def _largest_difference(t_out: list, p_out: list, by_value: bool) -> float | None:
    """The largest |paddle - torch| over the outputs paired (by value, or by position for a model's
    own outputs), positions both sides mask left out; None where none pair."""
    from ..compare.matching import masked_alike, pair_outputs
    from .one_pair import laid_out
    shapes = lambda a: [tuple(x.shape) for x in a]
    pairs = pair_outputs(shapes(t_out), shapes(p_out), lambda: t_out, lambda: p_out) if by_value \
        else pair_outputs(shapes(t_out), shapes(p_out))
    if not pairs or len(pairs.shapes) == 0:
        return None
    y_t = laid_out(pairs.of_torch(t_out), pairs.shapes)
    y_p = laid_out(pairs.of_paddle(p_out), pairs.shapes)
    diff = np.abs(np.subtract(y_p, y_t, dtype=np.float64))
    masked = masked_alike(y_t, y_p)
    if masked is not None:
        diff[masked] = 0
    return float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0
