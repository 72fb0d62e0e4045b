"""Every aligned layer from the forced passes: end-to-end metrics, the local (teacher-forced) error,
and its budget. One layer re-run on its own, and the figures every analysis shares: one_pair.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..compare.align import nearest_in
from ..compare.matching import OutputPairs, lay_out, masked_alike, masked_by_torch
from ..compare.budget import INPUT, LAYER, Budget, budget_for, own_errors
from ..compare.capture import is_first_call
from ..compare.identity import view_of
from ..compare.forced import ForcedCall, Reference, TorchOwn, differing_inputs, paddle_own_inside, torch_own_errors
from ..compare.paddle_own import INSIDE, measures_own_error, parameter_count
from ..compare.fused import sliced
from ..paths import is_under
from ..compare.replay import matmul_stats, refused_in, to_numpy_list
from .one_pair import (Local as Local, _fitted, end_to_end, joined as joined, judge_alone, judge_by_addition,
                       judged as judged, laid_out as laid_out, layer_budget as layer_budget, rounding_effect,
                       torch_read as torch_read, unmasked)
from .report import LayerResult

from ..compare.port import Session


ANALYSIS_THREADS = 8

# ---------------------------------------------------------------- all pairs, forced passes

def forced_pair(pair) -> bool:
    """The forced passes force `pair` (they force a module's first call; a later call of a module
    called more than once is judged on its own: one_pair.judge_alone)."""
    return is_first_call(pair.torch) and is_first_call(pair.paddle)


def _children(pairs) -> dict[str, list]:
    """Paired children of each pair that the forced passes force: the pairs whose nearest paired
    torch ancestor it is."""
    paired = {p.torch for p in pairs}
    out: dict[str, list] = {p.torch: [] for p in pairs}
    for pair in pairs:
        above = nearest_in(pair.torch, paired)
        if above is not None and forced_pair(pair):
            out[above].append(pair)
    return out


def _input_check(session: Session, child, differing: dict, passes: Passes):
    """(ratio, tolerance, error, budget terms, own errors) of the inputs the parent's own code computed for `child`, where
    they differ from torch's; None when none does. Paddle's own error where a float64 copy of the parent measured it
    (passes.paddle_inputs64)."""
    ref = passes.forced_64.get(child.torch)
    if ref is None:
        return None
    worst = None
    for i, got, t in differing.get(child.torch, ()):
        if i not in ref.input_err:
            continue
        if ref.input_err[i] is None or not np.issubdtype(got.dtype, np.floating):
            # integers (positions, ids) have no rounding: any difference is a bug
            found = (float("inf"), 0.0, float(np.abs(got.astype(np.float64) - t).max()), (), {})
        else:
            rounding = {f: lay_out(r[child.torch].input_err[i], t.shape) for f, r in passes.rounded_64.items()
                        if child.torch in r and r[child.torch].input_err.get(i) is not None}
            wide = passes.paddle_inputs64.get((child.torch, i))
            own = None if wide is None or wide.size != got.size else \
                np.subtract(got, lay_out(wide, t.shape), dtype=np.float64).astype(np.float32)
            e_ref = lay_out(ref.input_err[i], t.shape)
            budget = budget_for(INPUT, session.formats, t, e_ref, None, rounding, e_other=own)
            signed = got - t
            diff = np.abs(signed)
            judged_input = budget.judge(diff)
            found = (judged_input.ratio, judged_input.tolerance, float(diff.max()) if diff.size else 0.0,
                     judged_input.terms.terms, own_errors(e_ref, signed))
        if worst is None or found[0] > worst[0]:
            worst = found
    return worst


@dataclass(frozen=True)
class Passes:
    """What the full strategy gathered for its pairs, stage by stage, each stage a new Passes
    (dataclasses.replace): both captures and the pairs, S2 of every torch matmul module (complete
    once the worker that computes it is joined); the forced paddle pass and paddle's own errors at
    the leaves; the float64 references (and rounded ones per format).

    Three dicts are memos the judging fills as it goes, carried from stage to stage: the pairs'
    end-to-end comparisons (`e2e`: result, torch's output, output count; filled early where a
    wait leaves time), and paddle's own errors measured inside a layer over budget, with the
    inputs its code hands its children (`paddle_err`, `paddle_inputs64`)."""

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


def matmul_stats_all(session: Session, t_calls: dict, into: dict, stop=None) -> None:
    """S2 and K of every captured torch module, keyed by path (None for modules that are not
    matmuls), into `into`; needs no paddle run. With `stop`, it returns once `stop()` is true,
    and a later call does the rest."""
    for path, call in t_calls.items():
        if path in into:
            continue
        if stop is not None and stop():
            break
        into[path] = matmul_stats(session.torch_module(path), call, refused=refused_in(session, path))


def end_to_end_until(session: Session, passes: Passes, stop) -> None:
    """Pairs' end-to-end comparisons, in order, into passes.e2e until `stop()` is true (work to
    fill a wait with); analyze_all does the rest."""
    for pair in passes.pairs:
        if stop():
            return
        passes.e2e[pair.torch] = _end_to_end(session, pair, passes)


def _end_to_end(session: Session, pair, passes: Passes):
    return end_to_end(session, pair, passes.t_calls[pair.torch], passes.p_calls[pair.paddle])


def analyze_all(session: Session, passes: Passes, alone=None) -> list[LayerResult]:
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


PADDLE_OWN_INSIDE = "budgeted with paddle's own error, measured on a float64 copy of the layer on the same inputs"


def _measurable_inside(session: Session, pair, passes: Passes, row: LayerResult) -> bool:
    """`row` is over its budget and its paddle layer computes in its own code between layers inside
    it (an attention's products and softmax), in fp32 (an emulated format's rounding is budgeted as
    such): torch's observed error stood in for paddle's there, and paddle's kernels may sum in
    another order (its CPU matmuls and softmax on AVX2 against torch's). A layer holding a list of
    layers (the model, an encoder: its blocks), or too large, is not copied to float64."""
    import paddle

    from ..compare.forced import _layer_at
    if not measures_own_error(INSIDE, [row.ratio]) or pair.paddle in passes.paddle_err or not forced_pair(pair) \
            or session.formats.get("paddle") != "fp32":
        return False
    layer = _layer_at(session.paddle_model, pair.paddle)
    return bool(layer._sub_layers) and not any(isinstance(inner, paddle.nn.LayerList) for inner in layer.sublayers()) \
        and measures_own_error(INSIDE, [row.ratio], parameter_count(layer))


def _measured_inside(session: Session, pair, passes: Passes, children, row: LayerResult, again, torch_own: TorchOwn) -> LayerResult:
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


def _analyze_forced(session: Session, pair, passes: Passes, children, differing) -> LayerResult:
    row, y_t, pairs = passes.e2e.get(pair.torch) or _end_to_end(session, pair, passes)
    if y_t is None:
        return row
    if not forced_pair(pair):
        return judged(row, judge_alone(session, pair, passes.t_calls[pair.torch], passes.p_calls[pair.paddle], pairs,
                                       y_t))
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


def _worst_input(session: Session, own: Local, children, differing, passes: Passes) -> Local:
    """`own` where an input this layer's own code computed for one of its children is further
    over its budget than the layer's output (the worst such input)."""
    local = own
    for child in children:
        found = _input_check(session, child, differing, passes)
        if found is not None and found[0] > local.ratio:
            ratio, budget, max_abs, terms, own = found
            local = replace(local, ratio=ratio, budget=budget, max_abs=max_abs, worst_input=child.torch, terms=terms,
                            own_error=own).noted(
                f"worst at the input of {child.torch}, as this layer's own code computed it")
    return local


def _local(session: Session, pair, passes: Passes, ref, y_local, y_t, pairs: OutputPairs) -> Local:
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
    signed = np.subtract(y_local, y_t)
    if masked is not None:
        signed[masked] = 0
    own = own_errors(budget.observed, signed)  # (the references keep float64 - float32)
    del signed
    with np.errstate(over="ignore"):  # squared in the budget's dtype: float64 where float32's squares overflow
        q = np.square(diff, out=diff) if budget.var.dtype == diff.dtype else np.square(diff, dtype=budget.var.dtype)
        judged_output = budget.judge_squares(q.reshape(budget.var.shape))
    return Local(max_abs=top, mean_abs=mean, budget=judged_output.tolerance, ratio=judged_output.ratio,
                 terms=judged_output.terms.terms, own_error=own)


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
    if pair.part is None or not pair.part.reads_torch:
        return laid_out(pairs.of_torch(ref.output_err), pairs.shapes).reshape(y_t.shape)
    recorded = to_numpy_list(passes.t_calls[pair.torch].outputs, "torch")
    y64 = [np.add(t, e, dtype=np.float64) for t, e in zip(recorded, ref.output_err)]
    y64 = laid_out(pairs.of_torch(torch_read(pair, y64)), pairs.shapes).reshape(y_t.shape)
    return np.subtract(y64, y_t, dtype=np.float64).astype(np.float32)


def _output_budget(session: Session, pair, passes: Passes, ref, y_t, pairs: OutputPairs, masked=None) -> Budget:
    e_ref = _reference_error(pair, passes, ref, y_t, pairs)
    y_t, e_ref = unmasked(masked, y_t, e_ref)  # a float64 run masks with float64's lowest value
    with np.errstate(invalid="ignore", over="ignore"):
        alone = masked_by_torch(y_t, y_t.astype(np.float64) + e_ref)  # (the references keep float64 - float32)
    if alone.any():
        e_ref = np.where(alone, np.float32(0), e_ref)
    child = _returned_child(passes, pair, pairs) if passes.matmul.get(pair.torch) is None else None
    matmul = _fitted(passes.matmul.get(pair.torch) or (child and passes.matmul.get(child.torch)), y_t.shape)
    if pair.part is not None and pair.part.reads_torch:  # the references' rounding effects are on torch's raw outputs
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
    return budget_for(LAYER, session.formats, y_t, e_ref, matmul, rounding, condition, e_other)
