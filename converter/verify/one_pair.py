"""One aligned layer: its outputs compared end to end, its own (teacher-forced) error where it is
re-run on its own (the first layer over budget's evidence; a call the forced passes do not force),
and its budget. Every layer at once, from the forced passes: analyze.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..compare.align import LayerPair
from ..compare.matching import OutputPairs, common_shape, lay_out, masked_alike, merged_shape, pair_outputs
from ..compare.budget import Budget, MatmulStats, make_budget, own_errors
from ..compare.capture import Call, module_path
from ..compare.metrics import compare, join, rms_over
from ..compare.precision import ROUNDING_DRAWS
from ..compare.fused import sliced
from ..compare.replay import (forced_paddle_inputs, matmul_stats, refused_in, paddle_inputs, run_paddle, run_torch64, run_torch_module,
                              to_numpy_list, torch_inputs)
from .report import LayerResult

from ..compare.port import Session


@dataclass
class Evidence:
    """What an analysis saw, kept for the diagnosis of the first bad layer."""

    y_torch: np.ndarray | None = None
    y_local: np.ndarray | None = None
    y64: np.ndarray | None = None
    forced: tuple | None = None
    budget: Budget | None = None
    pairs: OutputPairs | None = None  # which outputs were compared, in what shapes
    pair: LayerPair | None = None  # the layer pair, whose reading says how torch's outputs are compared


def laid_out(arrays: list, shapes) -> np.ndarray:
    """The arrays broadcast to `shapes` and joined (see metrics.join)."""
    return join([lay_out(a, s) for a, s in zip(arrays, shapes)])


def torch_read(pair: LayerPair, outputs: list) -> list:
    """A pair's torch outputs (tensors or numpy arrays) as they are compared: its family's reading
    of them where the reading takes torch's side too (a grouped router's logits routed as its block
    routes them), else as they are."""
    return outputs if pair.part is None or not outputs else pair.part.of_torch(outputs)


def outputs_of(t_out: list, p_out: list) -> OutputPairs:
    return pair_outputs([tuple(a.shape) for a in t_out], [tuple(b.shape) for b in p_out],
                        lambda: to_numpy_list(t_out, "torch"), lambda: to_numpy_list(p_out, "paddle"))


def _pairing_note(t_out: list, p_out: list, pairs: OutputPairs) -> str:
    notes = []
    if pairs.torch != pairs.paddle or len(t_out) != len(p_out):
        notes.append(f"outputs paired by value: torch {list(pairs.torch)} with paddle {list(pairs.paddle)} "
                     f"(torch gives {len(t_out)}, paddle {len(p_out)})")
    axes, spans = pairs.orders(), pairs.cuts()
    for j, order, span in zip(pairs.paddle, axes, spans):
        if order is not None:
            notes.append(f"paddle's output {list(p_out[j].shape)} compared with its axes in the order {list(order)}, "
                         "torch's layout of the same values")
        if span is not None:
            notes.append(f"torch's output is elements {span[1]}:{span[2]} of paddle's {list(p_out[j].shape)} along "
                         f"axis {span[0]}: compared there")
    differ = [(list(t_out[i].shape), list(p_out[j].shape))
              for i, j, order, span in zip(pairs.torch, pairs.paddle, axes, spans)
              if tuple(t_out[i].shape) != tuple(p_out[j].shape) and order is None and span is None]
    merged = [(a, b) for a, b in differ if merged_shape(tuple(a), tuple(b)) is not None]
    broadcast = [d for d in differ if d not in merged]
    if broadcast:
        notes.append("compared after broadcasting: " + ", ".join(f"torch {a} vs paddle {b}" for a, b in broadcast))
    if merged:
        notes.append("the same elements with leading axes merged, compared as the merged shape: "
                     + ", ".join(f"torch {a} vs paddle {b}" for a, b in merged))
    return "; ".join(notes)


def _fitted(matmul: MatmulStats | None, shape) -> MatmulStats | None:
    """The stats laid out as an output of `shape` (broadcast where the output was); None when
    there are none or they do not fit."""
    if matmul is None:
        return None
    if matmul.sum_sq.shape == tuple(shape):
        return matmul
    if common_shape(matmul.sum_sq.shape, shape) == tuple(shape):
        return MatmulStats(lay_out(matmul.sum_sq, shape), matmul.k)
    if matmul.sum_sq.size != int(np.prod(shape)):
        return None
    return MatmulStats(matmul.sum_sq.reshape(shape), matmul.k)


def rounding_effect(session: Session, pair: LayerPair, call: Call, y64: np.ndarray, pairs: OutputPairs, fmt: str) -> np.ndarray:
    """The change of the float64 output, per element (its rms over ROUNDING_DRAWS draws), when
    every product in the layer rounds its inputs to `fmt`: the rounded run's outputs read and laid
    out as y64 was (paired and broadcast by `pairs`), so each element is set against its own."""
    draws = []
    for draw in range(ROUNDING_DRAWS):
        y_f = torch_read(pair, run_torch64(session.torch64_module(pair.torch), call, fmt, draw))
        y_f = laid_out(pairs.of_torch(y_f), pairs.shapes)
        draws.append(np.subtract(y_f.reshape(y64.shape), y64, dtype=np.float32, casting="same_kind"))
    return rms_over(draws).reshape(y64.shape)


def layer_budget(session: Session, pair: LayerPair, call: Call, y_t: np.ndarray, y64: np.ndarray, pairs: OutputPairs,
                 formats: dict) -> Budget:
    """The budget of torch's output `y_t` (y64 the float64 one, both read and laid out by `pairs`)."""
    matmul = _fitted(matmul_stats(session.torch_module(pair.torch), call, refused=refused_in(session, pair.torch)),
                     y64.shape)  # None for a layer that is no matmul
    rounding = {f: rounding_effect(session, pair, call, y64, pairs, f) for f in set(formats.values()) if f != "fp32"} \
        if matmul is None else {}
    return make_budget(formats, y_t, y64, matmul, rounding)


def _inputs_differ(t_call: Call, p_call: Call) -> str:
    """Where a pair's first inputs differ in shape too: that the shape changed before the pair, in
    code that is not compared on its own; else ""."""
    x, y = torch_inputs(t_call), paddle_inputs(p_call)
    if not x or not y or common_shape(tuple(x[0].shape), tuple(y[0].shape)) is not None:
        return ""
    return (f"; its inputs differ in shape already (torch {list(x[0].shape)}, paddle {list(y[0].shape)}): the shape "
            "changed before it, in code not compared on its own (a functional call, or a layer on one side only)")


def calls_said(t_call: Call, p_call: Call) -> str:
    """Which call a pair compares of a module called more than once ("paddle _pool, call 2 of 3"), on
    each side where it is one; else ""."""
    return joined(*(f"{side} {module_path(call.path) or '<model>'}, call {call.index} of {call.count}"
                    for side, call in (("torch", t_call), ("paddle", p_call)) if call.count > 1))


def end_to_end(session: Session, pair: LayerPair, t_call: Call, p_call: Call):
    """(the row with the end-to-end metrics, torch's matched outputs as one array or None, the
    shapes they are compared in)."""
    t_out, p_out = torch_read(pair, t_call.outputs), sliced(pair, p_call.outputs)
    pairs = outputs_of(t_out, p_out)
    calls = calls_said(t_call, p_call)
    if not pairs:
        shape = tuple(t_out[0].shape) if t_out else ()
        if t_out and p_out:
            return row(session, pair, shape, ratio=float("inf"), note=joined(calls, (
                f"outputs differ in shape: torch {[list(a.shape) for a in t_out]}, "
                f"paddle {[list(b.shape) for b in p_out]}{_inputs_differ(t_call, p_call)}"))), None, pairs
        side = "paddle's side" if t_out else "torch's side" if p_out else "either side"
        return row(session, pair, shape, ratio=float("inf") if t_out or p_out else 0.0,
                    note=joined(calls, "no floating output on " + side)), None, pairs
    note = joined(calls, pair.part and pair.part.note, _pairing_note(t_out, p_out, pairs))
    y_t = laid_out(to_numpy_list(pairs.of_torch(t_out), "torch"), pairs.shapes)
    y_p = laid_out(to_numpy_list(pairs.of_paddle(p_out), "paddle"), pairs.shapes)
    m = compare(*unmasked(masked_alike(y_t, y_p), y_t, y_p))
    return row(session, pair, pairs.shapes[0], max_abs=m.max_abs, mean_abs=m.mean_abs, max_rel=m.max_rel,
                cosine=m.cosine, nan=m.nan, inf=m.inf, worst_index=m.worst_index, note=note), y_t, pairs


def row(session: Session, pair: LayerPair, shape: tuple, **figures) -> LayerResult:
    return LayerResult(pair.torch, pair.paddle, pair.torch_type, pair.paddle_type, shape,
                       formats=dict(session.formats), **figures)


def unmasked(masked, *arrays) -> list:
    """The arrays with the positions both sides mask set to 0 (copies; as they are when None)."""
    if masked is None:
        return list(arrays)
    out = []
    for a in arrays:
        a = np.array(a, copy=True)
        a[masked] = 0
        out.append(a)
    return out


def joined(*notes) -> str:
    """The notes that say something, in order, as one."""
    return "; ".join(filter(None, notes))


@dataclass(frozen=True)
class Local:
    """A layer's own error as an analysis judged it: its max and mean abs, the budget's tolerance
    and the ratio (all None where it could not be judged), what the analysis says of it, and the
    child whose input, as this layer's own code computed it, gave the ratio (or "")."""

    max_abs: float | None = None
    mean_abs: float | None = None
    budget: float | None = None
    ratio: float | None = None
    notes: tuple[str, ...] = ()
    worst_input: str = ""
    terms: tuple = ()  # the budget's named terms at the worst element (LayerResult.terms)
    own_error: dict = field(default_factory=dict)  # side -> its largest error against float64

    def noted(self, note: str) -> Local:
        return replace(self, notes=self.notes + (note,))


def judged(row: LayerResult, local: Local) -> LayerResult:
    """The end-to-end row with the layer's own error and its notes."""
    return replace(row, local_max_abs=local.max_abs, local_mean_abs=local.mean_abs, budget=local.budget,
                   ratio=local.ratio, worst_input=local.worst_input, note=joined(row.note, *local.notes),
                   terms=local.terms, own_error=dict(local.own_error))


def culprit_evidence(session: Session, pair: LayerPair, t_call: Call, p_call: Call) -> Evidence:
    """What the diagnosis of the first layer over budget looks at: its paddle layer re-run whole on
    torch's inputs (its children not forced), torch's output and the float64 one, and the budget.
    The layer was judged already (analyze_all); its forced pass cannot give this: there every
    child takes torch's inputs, so a parent's own error shows at its children's inputs, not in its
    output, and a what-if on the parent needs the output its own code gives. Empty where the
    layer does not run on torch's inputs."""
    _, y_t, pairs = end_to_end(session, pair, t_call, p_call)
    if y_t is None:
        return Evidence()
    forced = forced_paddle_inputs(t_call, p_call)
    try:
        y_local_list = sliced(pair, run_paddle(session.paddle_layer(pair.paddle), *forced))
    except Exception:  # the layer refused torch's inputs: the diagnosis has the module pair only
        return Evidence()
    if not pairs.fits(y_local_list):
        return Evidence()
    y_local = laid_out(pairs.of_paddle(y_local_list), pairs.shapes)
    y64 = laid_out(pairs.of_torch(torch_read(pair, run_torch64(session.torch64_module(pair.torch), t_call))),
                   pairs.shapes)
    return Evidence(y_t, y_local, y64, forced, layer_budget(session, pair, t_call, y_t, y64, pairs, session.formats),
                    pairs, pair)


def _judge_local(y_ref: np.ndarray, y_other: np.ndarray, budget: Budget, note: str, y64: np.ndarray) -> Local:
    """`y_other` against torch's `y_ref` under `budget` (`y64`: the float64 reference of y_ref)."""
    local = compare(y_ref, y_other)
    diff = np.subtract(y_other, y_ref)
    judged = budget.judge(np.abs(np.nan_to_num(diff, nan=np.inf)))
    own = own_errors(np.subtract(y64, y_ref, dtype=np.float64).reshape(diff.shape), diff)
    return Local(max_abs=local.max_abs, mean_abs=local.mean_abs, budget=judged.tolerance, ratio=judged.ratio,
                 notes=(note,), terms=judged.terms.terms, own_error=own)


def judge_by_addition(session: Session, pair: LayerPair, t_call: Call, p_call: Call, pairs: OutputPairs) -> Local:
    """Where paddle's layer cannot be run on torch's inputs, judge what it adds: the torch module
    run in float64 (and in float32, for the budget) on the inputs paddle's layer really received,
    matched by value to torch's call; paddle's output against that. The error it inherited is
    then gone, and the rest is its own. A layer that cannot be judged this way either has no
    ratio, and the final outputs' check answers for it."""
    from ..compare.replay import torch_call_on
    try:
        call32, call64 = torch_call_on(t_call, p_call)
        module = session.torch_module(pair.torch)
        y32 = laid_out(pairs.of_torch(torch_read(pair, run_torch_module(module, call32))), pairs.shapes)
        y64 = laid_out(pairs.of_torch(torch_read(pair, run_torch64(session.torch64_module(pair.torch), call64))),
                       pairs.shapes)
    except Exception as exc:
        return Local(notes=(f"could not be judged: the torch module does not run on paddle's inputs "
                            f"({type(exc).__name__})",))
    y_p = laid_out(to_numpy_list(pairs.of_paddle(sliced(pair, p_call.outputs)), "paddle"), pairs.shapes)
    return _judge_local(y32, y_p, layer_budget(session, pair, call32, y32, y64, pairs, session.formats),
                        "judged by what it adds: torch's module run on the inputs paddle's layer received", y64)


ALONE = ("judged on its own, re-run on torch's inputs: a call of a module called more than once that the "
         "forced passes, which force a module's first call, do not force")


def judge_alone(session: Session, pair: LayerPair, t_call: Call, p_call: Call, pairs: OutputPairs, y_t: np.ndarray) -> Local:
    """A pair the forced passes do not force (a later call of a module called more than once, on
    either side): its paddle layer re-run on torch's recorded inputs of that call, against torch's
    output `y_t` (read and laid out by `pairs`), under the budget of the torch module re-run in
    float64 on them. Where the paddle layer does not run on torch's inputs, or gives outputs of
    other shapes, judged by what it adds (judge_by_addition)."""
    try:
        y_list = sliced(pair, run_paddle(session.paddle_layer(pair.paddle), *forced_paddle_inputs(t_call, p_call)))
    except Exception:  # the layer refused torch's inputs: what it adds is judged instead
        y_list = None
    if y_list is None or not pairs.fits(y_list):
        return judge_by_addition(session, pair, t_call, p_call, pairs)
    y_local = laid_out(pairs.of_paddle(y_list), pairs.shapes).reshape(y_t.shape)
    y64 = laid_out(pairs.of_torch(torch_read(pair, run_torch64(session.torch64_module(pair.torch), t_call))),
                   pairs.shapes).reshape(y_t.shape)
    y_t, y_local, y64 = unmasked(masked_alike(y_t, y_local), y_t, y_local, y64)  # positions both sides mask
    return _judge_local(y_t, y_local, layer_budget(session, pair, t_call, y_t, y64, pairs, session.formats), ALONE, y64)
