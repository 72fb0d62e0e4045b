"""One aligned layer: end-to-end metrics, the local (teacher-forced) error, and its budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..compare.align import LayerPair, nearest_in
from ..compare.matching import (OutputPairs, common_shape, lay_out, masked_alike, masked_by_torch, merged_shape,
                       pair_outputs)
from ..compare.budget import Budget, MatmulStats, budget_from_error, make_budget
from ..compare.capture import Call
from ..compare.identity import view_of
from ..compare.metrics import compare, join, rms_over
from ..compare.precision import ROUNDING_DRAWS
from ..compare.forced import ForcedCall, Reference, TorchOwn, differing_inputs, paddle_own_inside, torch_own_errors
from ..compare.fused import sliced
from ..paths import is_under
from ..compare.replay import (forced_paddle_inputs, matmul_stats, paddle_inputs, run_paddle, run_torch64, run_torch_module,
                              to_numpy_list, torch_inputs)
from .report import LayerResult


ANALYSIS_THREADS = 8


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
    read = getattr(pair.part, "of_torch", None)
    return outputs if read is None or not outputs else read(outputs)


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


def _matmul(module, call: Call, shape) -> MatmulStats | None:
    """S2 and K for a matmul layer whose output has `shape`; None for any other layer."""
    return _fitted(matmul_stats(module, call), shape)


def rounding_effect(session, pair: LayerPair, call: Call, y64: np.ndarray, pairs: OutputPairs, fmt: str) -> np.ndarray:
    """The change of the float64 output, per element (its rms over ROUNDING_DRAWS draws), when
    every product in the layer rounds its inputs to `fmt`: the rounded run's outputs read and laid
    out as y64 was (paired and broadcast by `pairs`), so each element is set against its own."""
    draws = []
    for draw in range(ROUNDING_DRAWS):
        y_f = torch_read(pair, run_torch64(session.torch64_module(pair.torch), call, fmt, draw))
        y_f = laid_out(pairs.of_torch(y_f), pairs.shapes)
        draws.append(np.subtract(y_f.reshape(y64.shape), y64, dtype=np.float32, casting="same_kind"))
    return rms_over(draws).reshape(y64.shape)


def layer_budget(session, pair: LayerPair, call: Call, y_t: np.ndarray, y64: np.ndarray, pairs: OutputPairs,
                 formats: dict) -> Budget:
    """The budget of torch's output `y_t` (y64 the float64 one, both read and laid out by `pairs`)."""
    matmul = _matmul(session.torch_module(pair.torch), call, y64.shape)
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
            "changed before it, in code not compared on its own (a functional call, or a module called more than "
            "once, whose first call alone is compared)")


def end_to_end(session, pair: LayerPair, t_call: Call, p_call: Call):
    """(the row with the end-to-end metrics, torch's matched outputs as one array or None, the
    shapes they are compared in)."""
    t_out, p_out = torch_read(pair, t_call.outputs), sliced(pair, p_call.outputs)
    pairs = outputs_of(t_out, p_out)
    if not pairs:
        shape = tuple(t_out[0].shape) if t_out else ()
        if t_out and p_out:
            return _row(session, pair, shape, ratio=float("inf"), note=(
                f"outputs differ in shape: torch {[list(a.shape) for a in t_out]}, "
                f"paddle {[list(b.shape) for b in p_out]}{_inputs_differ(t_call, p_call)}")), None, pairs
        side = "paddle's side" if t_out else "torch's side" if p_out else "either side"
        return _row(session, pair, shape, ratio=float("inf") if t_out or p_out else 0.0,
                    note="no floating output on " + side), None, pairs
    note = joined(pair.part and pair.part.note, _pairing_note(t_out, p_out, pairs))
    y_t = laid_out(to_numpy_list(pairs.of_torch(t_out), "torch"), pairs.shapes)
    y_p = laid_out(to_numpy_list(pairs.of_paddle(p_out), "paddle"), pairs.shapes)
    m = compare(*unmasked(masked_alike(y_t, y_p), y_t, y_p))
    return _row(session, pair, pairs.shapes[0], max_abs=m.max_abs, mean_abs=m.mean_abs, max_rel=m.max_rel,
                cosine=m.cosine, nan=m.nan, inf=m.inf, worst_index=m.worst_index, note=note), y_t, pairs


def _row(session, pair: LayerPair, shape: tuple, **figures) -> LayerResult:
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

    def noted(self, note: str) -> Local:
        return replace(self, notes=self.notes + (note,))


def judged(row: LayerResult, local: Local) -> LayerResult:
    """The end-to-end row with the layer's own error and its notes."""
    return replace(row, local_max_abs=local.max_abs, local_mean_abs=local.mean_abs, budget=local.budget,
                   ratio=local.ratio, worst_input=local.worst_input, note=joined(row.note, *local.notes))


def culprit_evidence(session, pair: LayerPair, t_call: Call, p_call: Call) -> Evidence:
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


def _judge_local(y_ref: np.ndarray, y_other: np.ndarray, budget: Budget, note: str) -> Local:
    """`y_other` against torch's `y_ref` under `budget`."""
    local = compare(y_ref, y_other)
    ratio, tolerance = budget.ratio(np.abs(np.nan_to_num(y_other - y_ref, nan=np.inf)))
    return Local(max_abs=local.max_abs, mean_abs=local.mean_abs, budget=tolerance, ratio=ratio, notes=(note,))


def judge_by_addition(session, pair: LayerPair, t_call: Call, p_call: Call, pairs: OutputPairs) -> Local:
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
                        "judged by what it adds: torch's module run on the inputs paddle's layer received")


# ---------------------------------------------------------------- all pairs, forced passes

def _children(pairs) -> dict[str, list]:
    """Paired children of each pair: the pairs whose nearest paired torch ancestor it is."""
    paired = {p.torch for p in pairs}
    out: dict[str, list] = {p.torch: [] for p in pairs}
    for pair in pairs:
        above = nearest_in(pair.torch, paired)
        if above is not None:
            out[above].append(pair)
    return out


def _input_check(session, child, differing: dict, forced_64: dict, rounded_64: dict, paddle64: dict):
    """(ratio, tolerance, error) of the inputs the parent's own code computed for `child`, where
    they differ from torch's; None when none does. `paddle64`: (child, input) -> the value a float64
    copy of the parent computed there (forced.paddle_own_inside), paddle's own error where measured."""
    ref = forced_64.get(child.torch)
    if ref is None:
        return None
    worst = None
    for i, got, t in differing.get(child.torch, ()):
        if i not in ref.input_err:
            continue
        if ref.input_err[i] is None or not np.issubdtype(got.dtype, np.floating):
            # integers (positions, ids) have no rounding: any difference is a bug
            found = (float("inf"), 0.0, float(np.abs(got.astype(np.float64) - t).max()))
        else:
            rounding = {f: lay_out(r[child.torch].input_err[i], t.shape) for f, r in rounded_64.items()
                        if child.torch in r and r[child.torch].input_err.get(i) is not None}
            wide = paddle64.get((child.torch, i))
            own = None if wide is None or wide.size != got.size else \
                np.subtract(got, lay_out(wide, t.shape), dtype=np.float64).astype(np.float32)
            budget = budget_from_error(session.formats, t, lay_out(ref.input_err[i], t.shape), None, rounding, e_other=own)
            diff = np.abs(got - t)
            ratio, tol = budget.ratio(diff)
            found = (ratio, tol, float(diff.max()) if diff.size else 0.0)
        if worst is None or found[0] > worst[0]:
            worst = found
    return worst


@dataclass
class Passes:
    """What the full strategy gathered for its pairs: both captures, the forced paddle pass,
    the float64 references (and rounded ones per format), S2 of every torch matmul module,
    and the pairs' end-to-end comparisons found so far (result, torch's output, output count)."""

    t_calls: dict
    p_calls: dict
    pairs: list
    forced_p: dict = field(default_factory=dict)
    forced_64: dict = field(default_factory=dict)
    rounded_64: dict = field(default_factory=dict)
    matmul: dict = field(default_factory=dict)  # torch path -> MatmulStats (S2 and K), None if not a matmul
    paddle_err: dict = field(default_factory=dict)  # paddle path -> its own fp32 errors (forced.paddle_own_errors)
    # (torch path, input index) -> a float64 copy of the enclosing paddle layer's value there (paddle_own_inside)
    paddle_inputs64: dict = field(default_factory=dict)
    e2e: dict = field(default_factory=dict)


def matmul_stats_all(session, t_calls: dict, into: dict | None = None, stop=None) -> dict[str, MatmulStats]:
    """S2 and K of every captured torch module, keyed by path (None for modules that are not
    matmuls), into `into`; needs no paddle run. With `stop`, it returns once `stop()` is true,
    and a later call does the rest."""
    out = {} if into is None else into
    for path, call in t_calls.items():
        if path in out:
            continue
        if stop is not None and stop():
            break
        out[path] = matmul_stats(session.torch_module(path), call)
    return out


def end_to_end_until(session, passes: Passes, stop) -> None:
    """Pairs' end-to-end comparisons, in order, into passes.e2e until `stop()` is true (work to
    fill a wait with); analyze_all does the rest."""
    for pair in passes.pairs:
        if stop():
            return
        passes.e2e[pair.torch] = _end_to_end(session, pair, passes)


def _end_to_end(session, pair, passes: Passes):
    return end_to_end(session, pair, passes.t_calls[pair.torch], passes.p_calls[pair.paddle])


def analyze_all(session, passes: Passes, alone=None) -> list[LayerResult]:
    """Every pair's local error against its budget, from the forced paddle pass and the
    float64 references (see forced.py) instead of one re-run per module. `alone()`, where given,
    returns once no other thread runs the float64 reference (a pass beside the analysis): the
    layers measured inside (_measured_inside) run it with hooks of their own."""
    differing = differing_inputs(passes.pairs, passes.t_calls, passes.forced_p)
    children = _children(passes.pairs)

    def one(pair):
        return _analyze_forced(session, pair, passes, children[pair.torch], differing)
    # numpy and torch release the GIL on whole-array work: one thread per core torch may use
    # (up to 8: the Python between the arrays is serial), each with one torch thread (OpenMP
    # keeps the count per thread)
    import torch
    from concurrent.futures import ThreadPoolExecutor
    if session.options.serial:
        rows = [one(pair) for pair in passes.pairs]
    else:
        workers = max(1, min(torch.get_num_threads(), ANALYSIS_THREADS))
        with ThreadPoolExecutor(max_workers=workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            rows = list(pool.map(one, passes.pairs))
    inside = [pair.torch for pair, row in zip(passes.pairs, rows) if _measurable_inside(session, pair, passes, row)]
    if inside and alone is not None:
        alone()
    torch_own = torch_own_errors(session, {p: [c.torch for c in children[p]] for p in inside}, passes.t_calls) \
        if inside else {}
    return [row if pair.torch not in torch_own else
            _measured_inside(session, pair, passes, children[pair.torch], row, one, torch_own[pair.torch])
            for pair, row in zip(passes.pairs, rows)]


PADDLE_INSIDE_SIZE = 1 << 28  # the most parameters a layer measured inside may have (2 GiB in float64)
PADDLE_OWN_INSIDE = "budgeted with paddle's own error, measured on a float64 copy of the layer on the same inputs"


def _measurable_inside(session, pair, passes: Passes, row: LayerResult) -> bool:
    """`row` is over its budget and its paddle layer computes in its own code between layers inside
    it (an attention's products and softmax), in fp32 (an emulated format's rounding is budgeted as
    such): torch's observed error stood in for paddle's there, and paddle's kernels may sum in
    another order (its CPU matmuls and softmax on AVX2 against torch's). A layer holding a list of
    layers (the model, an encoder: its blocks), or too large, is not copied to float64."""
    import paddle

    from ..compare.forced import _layer_at
    if row.ratio is None or row.ratio <= 1 or pair.paddle in passes.paddle_err \
            or session.formats.get("paddle") != "fp32":
        return False
    layer = _layer_at(session.paddle_model, pair.paddle)
    return bool(layer._sub_layers) and not any(isinstance(inner, paddle.nn.LayerList) for inner in layer.sublayers()) \
        and sum(int(np.prod(p.shape)) for p in layer.parameters()) <= PADDLE_INSIDE_SIZE


def _measured_inside(session, pair, passes: Passes, children, row: LayerResult, again, torch_own: TorchOwn) -> LayerResult:
    """`row` (_measurable_inside) judged again with paddle's own error, measured on a float64 copy of
    the layer (forced.paddle_own_inside), which budgets the layer's outputs and the inputs its code
    hands its children, where it is of the size rounding gives against torch's own over the whole
    module at the same tensors (`torch_own`). A difference of the port's own stays where the copy computes it too; one
    that runs in float32 alone (code branching on the dtype) is taken for paddle's own error up to
    forced.OWN_ERROR_TIMES torch's (a known gap: a bug whose effect is within that is passed)."""
    errs, inputs = paddle_own_inside(session, pair, passes, children, torch_own)
    if errs is None:
        return row
    passes.paddle_err[pair.paddle] = errs
    passes.paddle_inputs64.update(inputs)
    judged_again = again(pair)
    return replace(judged_again, note=joined(judged_again.note, PADDLE_OWN_INSIDE))


def _analyze_forced(session, pair, passes: Passes, children, differing) -> LayerResult:
    row, y_t, pairs = passes.e2e.get(pair.torch) or _end_to_end(session, pair, passes)
    if y_t is None:
        return row
    loc: ForcedCall | None = passes.forced_p.get(pair.paddle)
    ref: Reference | None = passes.forced_64.get(pair.torch)
    if loc is None or ref is None or len(ref.output_err) <= max(pairs.torch):
        return judged(replace(row, note=joined(row.note, "the forced paddle pass did not reach this layer")),
                      judge_by_addition(session, pair, passes.t_calls[pair.torch], passes.p_calls[pair.paddle], pairs))
    outputs = sliced(pair, loc.outputs)
    if not pairs.fits(outputs):
        return replace(row, note="the forced paddle layer gave outputs of another shape", ratio=float("inf"))
    y_local = laid_out(pairs.of_paddle(outputs), pairs.shapes)
    own = _local(session, pair, passes, ref, y_local, y_t, pairs)
    if loc.forcing is not None:
        own = own.noted(loc.forcing.note)
    return judged(row, _worst_input(session, own, children, differing, passes))


def _worst_input(session, own: Local, children, differing, passes: Passes) -> Local:
    """`own` where an input this layer's own code computed for one of its children is further
    over its budget than the layer's output (the worst such input)."""
    local = own
    for child in children:
        found = _input_check(session, child, differing, passes.forced_64, passes.rounded_64, passes.paddle_inputs64)
        if found is not None and found[0] > local.ratio:
            ratio, budget, max_abs = found
            local = replace(local, ratio=ratio, budget=budget, max_abs=max_abs, worst_input=child.torch).noted(
                f"worst at the input of {child.torch}, as this layer's own code computed it")
    return local


def _local(session, pair, passes: Passes, ref, y_local, y_t, pairs: OutputPairs) -> Local:
    """The error of a pair's own output, and its budget."""
    masked = masked_alike(y_t, y_local)
    diff = np.subtract(y_local, y_t)
    if masked is not None:
        diff[masked] = 0
    np.abs(diff, out=diff)
    top = float(diff.max())  # NaN when there is one
    if math.isnan(top):
        diff = np.nan_to_num(diff, nan=np.inf)
        top = float("inf")
    if top == 0:
        return Local(max_abs=top, mean_abs=0.0, ratio=0.0)  # bit-identical on the same inputs (same kernels): no budget
    mean = float(np.add.reduce(diff, axis=None)) / diff.size
    budget = _output_budget(session, pair, passes, ref, y_t, pairs, masked)
    with np.errstate(over="ignore"):  # squared in the budget's dtype: float64 where float32's squares overflow
        q = np.square(diff, out=diff) if budget.var.dtype == diff.dtype else np.square(diff, dtype=budget.var.dtype)
        ratio, tolerance = budget.ratio_of_squares(q.reshape(budget.var.shape))
    return Local(max_abs=top, mean_abs=mean, budget=tolerance, ratio=ratio)


def _returned_child(passes: Passes, pair, pairs: OutputPairs):
    """The deepest paired module inside `pair` whose one output `pair` returns as its own (a
    wrapper, a model ending in its head or its final norm), or None: that output's error is the
    child's, and the child's budget knows what torch's observed error does not show (the other
    side's matmul accumulation; paddle's own error, where it was measured)."""
    t_call = passes.t_calls[pair.torch]
    if len(pairs) != 1 or pairs.torch != (0,) or pairs.paddle != (0,) or not t_call.outputs:
        return None
    out = view_of(t_call.outputs[0])
    inside = [p for p in passes.pairs if p.torch != pair.torch and is_under(p.torch, pair.torch)]
    same = [p for p in inside if len(passes.t_calls[p.torch].outputs) == 1
            and view_of(passes.t_calls[p.torch].outputs[0]) == out]
    return max(same, key=lambda p: p.torch.count("."), default=None)


def _reference_error(pair, passes: Passes, ref, y_t, pairs: OutputPairs) -> np.ndarray:
    """float64 less torch's float32 at the pair's outputs as they are compared. Where torch's side
    is read (not linear: a router's routing), the reading of the float64 outputs (torch's recorded
    ones plus the reference's error, which is float64 less float32) less torch's read outputs."""
    if getattr(pair.part, "of_torch", None) is None:
        return laid_out(pairs.of_torch(ref.output_err), pairs.shapes).reshape(y_t.shape)
    recorded = to_numpy_list(passes.t_calls[pair.torch].outputs, "torch")
    y64 = [np.add(t, e, dtype=np.float64) for t, e in zip(recorded, ref.output_err)]
    y64 = laid_out(pairs.of_torch(torch_read(pair, y64)), pairs.shapes).reshape(y_t.shape)
    return np.subtract(y64, y_t, dtype=np.float64).astype(np.float32)


def _output_budget(session, pair, passes: Passes, ref, y_t, pairs: OutputPairs, masked=None) -> Budget:
    e_ref = _reference_error(pair, passes, ref, y_t, pairs)
    y_t, e_ref = unmasked(masked, y_t, e_ref)  # a float64 run masks with float64's lowest value
    with np.errstate(invalid="ignore", over="ignore"):
        alone = masked_by_torch(y_t, y_t.astype(np.float64) + e_ref)  # (the references keep float64 - float32)
    if alone.any():
        e_ref = np.where(alone, np.float32(0), e_ref)
    child = _returned_child(passes, pair, pairs) if passes.matmul.get(pair.torch) is None else None
    matmul = _fitted(passes.matmul.get(pair.torch) or (child and passes.matmul.get(child.torch)), y_t.shape)
    if getattr(pair.part, "of_torch", None) is not None:  # the references' rounding effects are on torch's raw outputs
        y64 = np.add(y_t, e_ref, dtype=np.float64)
        rounding = {f: unmasked(masked, rounding_effect(session, pair, passes.t_calls[pair.torch], y64, pairs, f))[0]
                    for f in passes.rounded_64} if matmul is None else {}
    else:
        rounding = {f: unmasked(masked, laid_out(pairs.of_torch(r[pair.torch].output_err), pairs.shapes).reshape(y_t.shape))[0]
                    for f, r in passes.rounded_64.items()
                    if pair.torch in r and len(r[pair.torch].output_err) > max(pairs.torch)} if matmul is None else {}
    condition = None
    if matmul is None and ref.condition is not None and len(pairs) == 1 and pairs.torch == (0,):
        condition = laid_out([ref.condition], pairs.shapes).reshape(y_t.shape)
    own = passes.paddle_err.get(pair.paddle)
    if own is None and child is not None:
        own = passes.paddle_err.get(child.paddle)
    e_other = None
    if own is not None and matmul is None:
        e_other = unmasked(masked, laid_out(pairs.of_paddle(own), pairs.shapes).reshape(y_t.shape))[0]
    return budget_from_error(session.formats, y_t, e_ref, matmul, rounding, condition, e_other)
