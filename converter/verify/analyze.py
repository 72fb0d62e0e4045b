"""One aligned layer: end-to-end metrics, the local (teacher-forced) error, and its budget."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .align import LayerPair
from .budget import Budget, MatmulStats, budget_from_error, make_budget
from .capture import Call
from .metrics import compare, join
from .precision import is_torch_matmul
from ..frameworks.torch_side import to_numpy as torch_numpy
from .forced import ForcedCall, Reference, forced_paddle, forced_torch64, torch_inputs
from .replay import forced_paddle_inputs, matmul_stats, run_paddle, run_torch64, to_numpy_list
from .report import LayerResult


@dataclass
class Evidence:
    """What an analysis saw, kept for the diagnosis of the first bad layer."""

    y_torch: np.ndarray | None = None
    y_local: np.ndarray | None = None
    y64: np.ndarray | None = None
    forced: tuple | None = None
    budget: Budget | None = None


def _matched(t_out: list[np.ndarray], p_out: list[np.ndarray]):
    """Outputs paired by position while their shapes agree."""
    pairs = []
    for a, b in zip(t_out, p_out):
        if a.shape != b.shape:
            break
        pairs.append((a, b))
    return pairs


def _matmul(module, call: Call, shape) -> MatmulStats | None:
    """S2 and K for a matmul layer whose output has `shape`; None for any other layer."""
    matmul = matmul_stats(module, call) if is_torch_matmul(module) else None
    if matmul is None or matmul.s2.size != int(np.prod(shape)):
        return None
    matmul.s2 = matmul.s2.reshape(shape)
    return matmul


def rounding_rms(session, path: str, call: Call, y64: np.ndarray, fmt: str) -> float:
    """rms change of the float64 output when the layer's matmul inputs are rounded to `fmt`."""
    y_f = join(run_torch64(session.torch64_module(path), call, fmt))
    return float(np.sqrt(np.mean((y_f.ravel()[: y64.size] - y64.ravel()) ** 2))) if y64.size else 0.0


def layer_budget(session, path: str, call: Call, y_t: np.ndarray, y64: np.ndarray, formats: dict) -> Budget:
    matmul = _matmul(session.torch_module(path), call, y64.shape)
    rounding = {f: rounding_rms(session, path, call, y64, f) for f in set(formats.values()) if f != "fp32"} \
        if matmul is None else {}
    return make_budget(formats, y_t, y64, matmul, rounding)


def end_to_end(session, pair: LayerPair, t_call: Call, p_call: Call):
    """(result with the end-to-end metrics, torch's matched outputs as one array or None, their count)."""
    t_out = to_numpy_list(t_call.outputs, "torch")
    p_out = to_numpy_list(p_call.outputs, "paddle")
    matched = _matched(t_out, p_out)
    result = LayerResult(pair.torch, pair.paddle, pair.torch_type, pair.paddle_type,
                         tuple(t_out[0].shape) if t_out else (), formats=dict(session.formats))
    if not matched:
        result.note = (f"outputs do not match in shape: torch {[list(a.shape) for a in t_out]}, "
                       f"paddle {[list(b.shape) for b in p_out]}")
        result.ratio = float("inf") if t_out and p_out else None
        return result, None, 0
    y_t = join([a for a, _ in matched])
    m = compare(y_t, join([b for _, b in matched]))
    result.max_abs, result.mean_abs, result.max_rel, result.cosine = m.max_abs, m.mean_abs, m.max_rel, m.cosine
    result.nan, result.inf, result.worst_index = m.nan, m.inf, m.worst_index
    return result, y_t, len(matched)


def analyze(session, pair: LayerPair, t_call: Call, p_call: Call, evidence: bool = False):
    """One pair, its paddle layer re-run on its own: the evidence for a diagnosis."""
    result, y_t, n = end_to_end(session, pair, t_call, p_call)
    ev = Evidence()
    if y_t is None:
        return (result, ev) if evidence else result
    forced = forced_paddle_inputs(t_call, p_call)
    if forced is None:
        result.note = "inputs could not be matched for teacher forcing; compared end to end only"
        return (result, ev) if evidence else result
    try:
        y_local_list = run_paddle(session.paddle_layer(pair.paddle), *forced)
    except Exception as exc:  # the layer refused torch's inputs: keep the end-to-end figures
        result.note = f"re-running the paddle layer on torch's inputs failed ({type(exc).__name__}); compared end to end only"
        return (result, ev) if evidence else result
    y_local = join(y_local_list[:n]) if len(y_local_list) >= n else None
    if y_local is None or y_local.size != y_t.size:
        result.note = "the re-run paddle layer gave outputs of another shape"
        result.ratio = float("inf")
        return (result, ev) if evidence else result
    y64 = join(run_torch64(session.torch64_module(pair.torch), t_call)[:n])
    if y64.size != y_t.size:
        y64 = y_t.astype(np.float64)
    y_local = y_local.reshape(y_t.shape)
    y64 = y64.reshape(y_t.shape)
    budget = layer_budget(session, pair.torch, t_call, y_t, y64, session.formats)
    local = compare(y_t, y_local)
    result.local_max_abs, result.local_mean_abs = local.max_abs, local.mean_abs
    diff = np.abs(np.nan_to_num(y_local - y_t, nan=np.inf))
    result.ratio, result.budget = budget.ratio(diff)
    if local.nan or local.inf:
        result.ratio = float("inf")
        result.note = f"paddle gives {local.nan} NaN and {local.inf} Inf values where torch does not"
    ev = Evidence(y_t, y_local, y64, forced, budget)
    return (result, ev) if evidence else result


# ---------------------------------------------------------------- all pairs, forced passes

def _children(pairs) -> dict[str, list]:
    """Paired children of each pair: the pairs whose nearest paired torch ancestor it is."""
    paired = {p.torch for p in pairs}
    out: dict[str, list] = {p.torch: [] for p in pairs}
    for pair in pairs:
        path = pair.torch
        while path:
            path = path.rsplit(".", 1)[0] if "." in path else ""
            if path in paired:
                out[path].append(pair)
                break
    return out


def _boundary(session, child, t_calls, forced_p: dict, forced_64: dict, rounded_64: dict):
    """(ratio, tolerance, error) of the inputs the parent's own code computed for `child`."""
    loc, ref = forced_p.get(child.paddle), forced_64.get(child.torch)
    if loc is None or ref is None:
        return None
    torch_in = [torch_numpy(t) for t in torch_inputs(t_calls[child.torch])]
    worst, used = None, set()
    for i, t in enumerate(torch_in):
        j = next((j for j, c in enumerate(loc.computed) if j not in used and c.shape == t.shape), None)
        if j is None or i >= len(ref.input_err):
            continue
        used.add(j)
        got = loc.computed[j]
        if np.array_equal(got, t):
            found = (0.0, 0.0, 0.0)  # the usual case: the code passed the value on unchanged
        elif ref.input_err[i] is None or not np.issubdtype(got.dtype, np.floating):
            # integers (positions, ids) have no rounding: any difference is a bug
            found = (float("inf"), 0.0, float(np.abs(got.astype(np.float64) - t).max()))
        else:
            rounding = {f: r[child.torch].input_rms[i] for f, r in rounded_64.items()
                        if child.torch in r and i < len(r[child.torch].input_rms)}
            budget = budget_from_error(session.formats, t, ref.input_err[i], None, rounding)
            diff = np.abs(got - t)
            ratio, tol = budget.ratio(diff)
            found = (ratio, tol, float(diff.max()) if diff.size else 0.0)
        if worst is None or found[0] > worst[0]:
            worst = found
    return worst


def analyze_all(session, pairs, t_calls: dict, p_calls: dict) -> list[LayerResult]:
    """Every pair's end-to-end metrics and local error, from two forced passes (plus one per
    lower-precision format in use) instead of one re-run per module."""
    forced_p = forced_paddle(session, pairs, t_calls)
    forced_64 = forced_torch64(session, pairs, t_calls)
    rounded_64 = {f: forced_torch64(session, pairs, t_calls, f) for f in set(session.formats.values()) - {"fp32"}}
    children = _children(pairs)

    def one(pair):
        return _analyze_forced(session, pair, t_calls[pair.torch], p_calls[pair.paddle], forced_p, forced_64,
                               rounded_64, children[pair.torch], t_calls)
    # numpy releases the GIL on whole-array work: two threads keep both cores busy
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, pairs))


def _analyze_forced(session, pair, t_call, p_call, forced_p, forced_64, rounded_64, children, t_calls):
    result, y_t, n = end_to_end(session, pair, t_call, p_call)
    if y_t is None:
        return result
    loc: ForcedCall | None = forced_p.get(pair.paddle)
    ref: Reference | None = forced_64.get(pair.torch)
    if loc is None or ref is None or loc.unmatched or len(loc.outputs) < n or len(ref.output_err) < n:
        result.note = "inputs could not be matched for teacher forcing; compared end to end only"
        return result
    y_local = join(loc.outputs[:n])
    if y_local.size != y_t.size:
        result.note, result.ratio = "the forced paddle layer gave outputs of another shape", float("inf")
        return result
    y_local = y_local.reshape(y_t.shape)
    diff = np.abs(y_local - y_t)
    if np.isnan(diff).any():
        diff = np.nan_to_num(diff, nan=np.inf)
    result.local_max_abs, result.local_mean_abs = float(diff.max()), float(diff.mean())
    if result.local_max_abs == 0:
        result.ratio = 0.0  # bit-identical on the same inputs (same kernels): no budget needed
    else:
        result.ratio, result.budget = _output_budget(session, pair, t_call, ref, rounded_64, y_t, n).ratio(diff)
    for child in children:
        found = _boundary(session, child, t_calls, forced_p, forced_64, rounded_64)
        if found is not None and found[0] > result.ratio:
            result.ratio, result.budget, result.local_max_abs = found
            result.note = f"worst at the input of {child.torch}, as this layer's own code computed it"
    return result


def _output_budget(session, pair, t_call, ref, rounded_64, y_t, n) -> Budget:
    e_ref = join(ref.output_err[:n]).reshape(y_t.shape)
    matmul = _matmul(session.torch_module(pair.torch), t_call, y_t.shape)
    rounding = {f: max(r[pair.torch].output_rms[:n], default=0.0)
                for f, r in rounded_64.items() if pair.torch in r} if matmul is None else {}
    return budget_from_error(session.formats, y_t, e_ref, matmul, rounding)
