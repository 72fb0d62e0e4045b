"""Judging outputs end to end: a unit's (or the model's) outputs as both models computed them,
free-running, against the end-to-end budget, with the float64 torch model's free-running outputs
as the reference; the checks that both models return the same outputs and that torch's own run is
a reference (deterministic, finite)."""

from __future__ import annotations

import math

import numpy as np

from ..compare.align import shapes_fit
from .one_pair import joined, laid_out, outputs_of, row, unmasked
from ..compare.fused import sliced
from ..compare.budget import END_TO_END, budget_for, own_errors
from ..frameworks import torch_side
from ..compare.capture import Allowance, capture_calls, capture_torch, wanted_calls
from ..compare.matching import masked_alike, masked_by_torch, pair_outputs
from ..compare.metrics import compare, rms, rms_over
from ..compare.precision import ROUNDING_DRAWS
from ..compare.replay import to_numpy_list
from ..errors import UserError
from .report import LayerResult

from ..compare.port import Session


FINAL_OUTPUTS = "the final outputs, end to end (free-running), against the torch model's own drift from float64"


def same_outputs(session: Session, t_call, p_call) -> None:
    """Both models must return the same structure (keys of the same type in the same order, the
    same positions; lists and tuples alike) holding at least one floating tensor, and the same
    tensors: an output on one side only is never compared, so it is bad input, not a pass. The
    same structure whose tensors hold other numbers of elements (an LSTM run time-major on one
    side, a head on its last state) is a port bug, judged: the final outputs fail, and the layers
    say where the shapes part."""
    t_said, p_said = session.returned.get("torch", "?"), session.returned.get("paddle", "?")
    cut = lambda said: said if len(said) <= 160 else said[:157] + "..."
    if not t_call.shapes and not p_call.shapes:
        raise UserError(f"neither model returns a floating tensor: torch_model() returns {cut(t_said)}, paddle_model() "
                        f"returns {cut(p_said)}; verify-port compares floating outputs: make both forwards return "
                        "their output tensors")
    if shapes_fit(t_call, p_call):
        if t_said != p_said:
            raise UserError(f"the two models return different structures: torch_model() returns {cut(t_said)}, "
                            f"paddle_model() returns {cut(p_said)}; make both return the same structure (the same "
                            "keys, of the same type, in the same order), or wrap one model to return what the other does")
        return
    a, b = t_call.shapes, p_call.shapes
    if t_said == p_said and len(a) == len(b) and any(math.prod(x) != math.prod(y) for x, y in zip(a, b)):
        return
    said = lambda shapes: f"{len(shapes)} floating tensor(s) {', '.join(str(list(s)) for s in shapes) or ''}".strip()
    raise UserError(f"the two models return different outputs: torch_model() gives {said(a)}, paddle_model() gives "
                    f"{said(b)}; make both return the same tensors in the same order (HF models: use_cache=False, "
                    "no hidden states or attentions; or wrap one model to return what the other does)")


def free_reference(session: Session, paths, fmt: str | None = None, draw: int = 0, counts: dict | None = None,
                   allowance: Allowance | None = None) -> dict[str, list[np.ndarray]]:
    """Per path in `paths` that the forward calls, the float64 torch model's outputs there,
    free-running (nothing forced), in one pass, with matmul inputs rounded to `fmt` if given (see
    precision.torch_rounding for `draw`); `counts` (torch path -> the calls a forward makes): the
    pass ends once those at `paths` have completed; `allowance`: bounds what the pass holds."""
    ref = capture_calls(torch_side, session.torch64, lambda: session.run_torch64(fmt, draw), set(paths),
                        allowance=allowance, until=wanted_calls(paths, counts))
    return {path: to_numpy_list(ref.calls[path].outputs, "torch") for path in paths if path in ref.calls}


def free_references(session: Session, paths, counts: dict | None = None,
                    allowance: Allowance | None = None) -> dict[str, dict]:
    """Per path, free_reference in float64 (key None), and per lower-precision format in use, a
    list of ROUNDING_DRAWS draws; one float64 pass per draw for all the paths; `counts` and
    `allowance`: as in free_reference."""
    out = {path: {None: outputs} for path, outputs in free_reference(session, paths, counts=counts,
                                                                     allowance=allowance).items()}
    for f in sorted(set(session.formats.values()) - {"fp32"}):
        for draw in range(ROUNDING_DRAWS):
            for path, outputs in free_reference(session, paths, f, draw, counts, allowance).items():
                out[path].setdefault(f, []).append(outputs)
    return out


RUN_TO_RUN_SHARE = 0.25  # two torch runs may differ by this share of the budget and still count as one
DRIFT_SUSPECT = 1e-3  # rms fp32 drift from float64, relative to the output's rms, that arithmetic alone rarely gives


def _implausible_drift(y32: np.ndarray, y64: np.ndarray) -> bool:
    scale, drift = rms(y64), rms(y32, y64)
    return not np.isfinite(drift) or drift > DRIFT_SUSPECT * scale


def _torch_deterministic(session: Session, path: str, y_t: np.ndarray, pairs, shapes, budget) -> str:
    """A torch forward that gives other values on the same inputs (dropout left on) makes every
    budget meaningless, since each is measured against torch's own run: that is bad input. Two
    runs that differ within the budget are the kernels' own noise (some CPUs' bf16 and threaded
    kernels do not sum in a fixed order; dropout moves outputs by their own size): a note."""
    again = capture_torch(session, {path})
    y_again = laid_out(to_numpy_list(pairs.of_torch(again.calls[path].outputs), "torch"), shapes)
    if np.array_equal(y_again, y_t, equal_nan=True):
        return ""
    diff = np.abs(np.nan_to_num(y_again - y_t, nan=np.inf)) if y_t.size else np.zeros(0, np.float32)
    ratio, _ = budget.ratio(diff)
    worst = float(diff.max()) if diff.size else 0.0
    if ratio <= RUN_TO_RUN_SHARE:
        return (f"torch's own two runs differ by up to {worst:.3g} (ratio {ratio:.2g} of the budget): the kernels' "
                "summation order, not randomness")
    raise UserError(f"torch_model() gives other outputs on the same inputs (max abs {worst:.3g} between two runs "
                    f"at {path or 'the model'}): something random is active, such as dropout in training mode or "
                    "F.dropout(..., training=True); call eval() and pass training=self.training, then verify again")


def _finite_reference(session: Session, unit, y_t, y_p, y64, t_calls: dict | None = None) -> tuple:
    """The outputs to compare, where torch's own float32 run is a reference: a NaN or Inf there
    that its float64 run does not give too (float32 overflowed: inputs of 1e38) is bad input,
    named where it first appears; an infinity all three give alike (a mask of -inf the model
    means) is no error and is left out, as masked positions are. Paddle's NaN or Inf where torch's
    value is finite stays in: over any budget."""
    if np.isfinite(y_t).all() and np.isfinite(y64).all():
        return y_t, y_p, y64
    with np.errstate(invalid="ignore"):
        meant = ~np.isfinite(y_t) & (y_t == y64)
    wrong = ~np.isfinite(y_t) & ~meant
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        first = _first_non_finite(t_calls) if t_calls is not None else None
        at = f"; the first module whose output is not finite: {first or '<model>'}" if first is not None else ""
        raise UserError(f"torch_model()'s own float32 run gives {y_t.flat[i]} at element {i} of "
                        f"{'its outputs' if unit.torch == '' else repr(unit.torch) + ' outputs'}, where its float64 "
                        f"run gives {y64.flat[i]:.4g}{at}: with no finite reference there is nothing to compare the "
                        "port with; give inputs of a smaller scale (float32 holds up to 3.4e38), or fix the torch model")
    y_t, y_p, y64 = unmasked(meant & (y_p == y_t), y_t, y_p, y64)  # the same infinity on every side
    y64[~np.isfinite(y64)] = y_t[~np.isfinite(y64)]  # float64 overflowed where float32 did not: no drift known
    return y_t, y_p, y64


def _first_non_finite(t_calls: dict) -> str | None:
    """The first torch module, in completion order, whose recorded floating output holds a NaN or Inf."""
    for call in sorted(t_calls.values(), key=lambda c: c.end):
        if any(not np.isfinite(a).all() for a in to_numpy_list(call.outputs, "torch")):
            return call.path
    return None


def judge_end_to_end(session: Session, unit, t_out: list, p_out: list, references: dict, note: str,
                     condition: np.ndarray | None = None, t_calls: dict | None = None,
                     paddle64=None) -> LayerResult:
    """`unit`'s outputs as both models computed them, free-running, against the end-to-end
    budget: the torch model's own fp32 drift from float64 there (observed), grown by the
    formats each side uses (the rms effect of rounding matmul inputs to them), on both sides,
    and by the last op's condition where the unit is elementwise (see forced._condition).
    `paddle64`: what gives the float64 paddle copy's outputs at paddle paths (by default
    session.paddle64_outputs)."""
    # the model's own outputs pair by position (same_outputs checked their structures): by value,
    # a port that swaps two outputs would pass
    pairs = pair_outputs([tuple(a.shape) for a in t_out], [tuple(b.shape) for b in p_out]) if unit.torch == "" \
        else outputs_of(t_out, p_out)
    shapes = pairs.shapes
    if not shapes or len(shapes) != len(t_out):
        differ = (f"outputs differ in shape: torch {[list(a.shape) for a in t_out]}, paddle "
                  f"{[list(b.shape) for b in p_out]}")
        return row(session, unit, tuple(t_out[0].shape) if t_out else (), note=joined(differ, unit.torch and note),
                   ratio=float("inf"))
    y_t = laid_out(to_numpy_list(pairs.of_torch(t_out), "torch"), shapes)
    y_p = laid_out(to_numpy_list(pairs.of_paddle(p_out), "paddle"), shapes)
    y64 = laid_out(pairs.of_torch(references[None]), shapes)
    masked = masked_alike(y_t, y_p)  # positions both sides mask (a position bias that carries its mask)
    y_t, y_p, y64 = unmasked(masked, y_t, y_p, y64)
    y64 = np.where(masked_by_torch(y_t, y64), y_t, y64)  # a mask on torch's side only: no drift known there
    y_t, y_p, y64 = _finite_reference(session, unit, y_t, y_p, y64, t_calls)
    m = compare(y_t, y_p)
    rounding = {f: rms_over([unmasked(masked, laid_out(pairs.of_torch(r), shapes))[0] - y64 for r in draws])
                for f, draws in references.items() if f is not None}
    if condition is not None and (len(shapes) != 1 or condition.size != y_t.size):
        condition = None
    condition = None if condition is None else laid_out([condition], shapes).reshape(y_t.shape)
    e_torch = np.subtract(y_t, y64, dtype=np.float64).astype(np.float32)
    budget = budget_for(END_TO_END, session.formats, y_t, e_torch, None, rounding, condition)
    drift = _torch_deterministic(session, unit.torch, y_t, pairs, shapes, budget) if _implausible_drift(y_t, y64) else ""
    signed = y_p - y_t
    diff = np.abs(np.nan_to_num(signed, nan=np.inf))
    judged = budget.judge(diff)
    if judged.ratio > 1:  # the budget took paddle's drift to be torch's: measure paddle's own, as its kernels sum
        own = (paddle64 or session.paddle64_outputs)([unit.paddle])
        if own is not None:
            y_p64 = laid_out(pairs.of_paddle(sliced(unit, own[unit.paddle])), shapes)
            e_paddle = unmasked(masked, np.subtract(y_p, y_p64, dtype=np.float64).astype(np.float32))[0]
            budget = budget_for(END_TO_END, session.formats, y_t, e_torch, None, rounding, condition, e_paddle)
            judged = budget.judge(diff)
            drift = joined(drift, PADDLE_DRIFT)
    return row(session, unit, shapes[0], note=joined(note, drift), max_abs=m.max_abs, mean_abs=m.mean_abs,
               max_rel=m.max_rel, cosine=m.cosine, nan=m.nan, inf=m.inf, worst_index=m.worst_index, ratio=judged.ratio,
               budget=judged.tolerance, terms=judged.terms.terms, own_error=own_errors(np.negative(e_torch), signed))


PADDLE_DRIFT = "budgeted with paddle's own drift from float64, measured on a float64 copy of the paddle model"
