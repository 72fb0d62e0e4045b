"""A paddle layer's own fp32 error, measured on a float64 copy of it on torch's recorded inputs.

torch's observed error (its float32 run against its float64 copy) stands in for paddle's where
both sides' kernels round alike. Where they do not (paddle's CPU kernels reduce in an order of
their own: a mean over 1536 values ten times less exact than torch's), paddle's own error is
measured: the paddle layer copied to float64 and run on the same inputs as its forced run. A leaf
is measured so directly; a layer with layers inside only where its error everywhere is of the
size rounding gives against torch's own over the whole module.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..frameworks import paddle_side, torch_side
from ..patches import thread_patch
from .capture import call_tensors
from .fused import sliced
from .shapes import undone
from .precision import U32
from .replay import forced_paddle_inputs
from ..tree import flatten, is_paddle_tensor, map_leaves, model_copy

from .port import Session


def _layer_at(model, path: str):
    """The paddle layer at `path`, as session.paddle_layer finds it, without making the weights of
    its block where they are streamed."""
    layer = model
    for part in filter(None, path.split(".")):
        layer = layer._sub_layers[part]
    return layer



# Where paddle's own error is measured, one rule for every check: LEAF, a paired forward leaf that
# is no matmul (cheap; measured always); INSIDE, a forward layer with layers inside, once over its
# budget on torch's error alone; BACKWARD, a layer's backward rows, once one is past half its
# budget on torch's error alone. Each kind copies layers of at most so many parameters to float64.
LEAF, INSIDE, BACKWARD = "leaf", "inside", "backward"
OWN_FROM = {LEAF: 0.0, INSIDE: 1.0, BACKWARD: 0.5}  # the ratio on torch's error alone past which it is measured
OWN_SIZE = {LEAF: 1 << 20, INSIDE: 1 << 28, BACKWARD: None}  # None: no limit (the layer is in memory already)


def measures_own_error(kind: str, ratios, parameters: int = 0) -> bool:
    """Whether paddle's own error is measured for a layer of `kind` (LEAF, INSIDE, BACKWARD) whose
    rows have `ratios` on torch's error alone (None: not judged) and which holds `parameters`."""
    size = OWN_SIZE[kind]
    past = kind == LEAF or any(r is not None and r > OWN_FROM[kind] for r in ratios)
    return past and (size is None or parameters <= size)


def parameter_count(layer) -> int:
    return sum(int(np.prod(p.shape)) for p in layer.parameters())


LOWER_FLOATS = ("float32", "float16", "bfloat16")


@contextlib.contextmanager
def _paddle_keeps_float64(lower=LOWER_FLOATS):
    """Casts to the float formats `lower` give float64 inside the block (PaddleNLP's RMSNorm
    computes in float32 whatever its input, as HF's does); paddle's casts all go through the
    operator paddle._C_ops.cast, which is replaced for the block, on the calling thread alone."""
    import paddle

    def keeping(cast):
        return lambda x, dtype: cast(x, paddle.float64 if str(dtype).rpartition(".")[2] in lower else dtype)
    with thread_patch(paddle._C_ops, "cast").patched(keeping):
        yield


def _hands_on_its_input(t_call, outputs: list) -> bool:
    """A layer whose one output is its first input, bit for bit (dropout in eval mode, an
    identity): it does no arithmetic, so it has no error of its own to measure."""
    first = t_call.args[0] if t_call.args else None
    if len(outputs) != 1 or not torch_side.is_tensor(first) or tuple(first.shape) != outputs[0].shape:
        return False
    first = torch_side.to_numpy(first)
    return first.dtype == outputs[0].dtype and np.array_equal(first, outputs[0])


def paddle_own_errors(session: Session, passes) -> dict[str, list]:
    """Per paired paddle leaf that is no matmul (norms, softmax, activations: layers whose
    kernels reduce in an order of their own, which torch's observed error does not show; paddle's
    CPU mean over 1536 values is ten times less exact than torch's), its own fp32 error on torch's
    inputs: its forced output minus a float64 copy of the layer's output on the same inputs.
    Casts inside to a lower precision are kept in float64 (see _paddle_keeps_float64). Layers that
    do not run in float64, return another dtype, or come out exactly equal are left out: torch's
    error stands in for theirs."""
    out = {}
    for pair in passes.pairs:
        loc = passes.forced_p.get(pair.paddle)
        layer = _layer_at(session.paddle_model, pair.paddle)  # weights made (streamed) only for a layer measured
        if loc is None or not loc.outputs or passes.matmul.get(pair.torch) is not None or layer._sub_layers \
                or not measures_own_error(LEAF, (), parameter_count(layer)) \
                or _hands_on_its_input(passes.t_calls[pair.torch], loc.outputs):
            continue
        drawn = paddle_side.random_state(session.device)
        run = _run_float64(session, pair, passes.t_calls[pair.torch], passes.p_calls[pair.paddle])
        errs = _own_output_errors(pair, loc, run)
        if errs is not None and paddle_side.may_differ_again(drawn, session.device) and not _same_run(
                run, _run_float64(session, pair, passes.t_calls[pair.torch], passes.p_calls[pair.paddle])):
            _note_random(session, pair.paddle)  # an error re-measured on a random draw would hold the draw
            continue
        if errs is not None:
            out[pair.paddle] = errs
    return out


def _note_random(session: Session, path: str) -> None:
    """Said in the report's notes: a paddle layer whose float64 copy gave other outputs on a second
    run of the same inputs (its own error is then not measured: torch's stands in)."""
    session.plan.notes.append(f"paddle layer '{path}' is not deterministic in eval: a float64 copy of it gave other "
                              "outputs on a second run of the same inputs (dropout active or a random op in eval: "
                              "paddle.nn.functional.dropout defaults to training=True); its own error was not "
                              "measured")


def _run_float64(session: Session, pair, t_call, p_call, inside=(), lower=LOWER_FLOATS):
    """The float32 outputs of a float64 copy of `pair`'s paddle layer on torch's recorded inputs
    (casts inside to the formats `lower` kept in float64), and, per layer path relative to it in
    `inside`, the floating inputs of its first call there; None where the copy does not run in
    float64."""
    import paddle

    wide = lambda value: map_leaves(value, lambda t: t.astype("float64") if t.dtype == paddle.float32 else t,
                                    is_paddle_tensor)
    seen, handles = {}, []
    layer = session.paddle_layer(pair.paddle)
    try:
        args, kwargs = forced_paddle_inputs(t_call, p_call)
        layer64 = model_copy(layer)
        layer64.to(dtype="float64")
        for path in inside:
            def pre(lay, a, kw, _path=path):
                seen.setdefault(_path, [paddle_side.to_numpy(t) for t in call_tensors(a, kw, paddle_side.is_tensor)])
            handles += paddle_side.add_hooks(_layer_at(layer64, path), pre)
        with paddle.no_grad(), _paddle_keeps_float64(lower):
            ys = flatten(layer64(*wide(args), **wide(kwargs)), paddle_side.is_float_tensor)
    except Exception as exc:  # noqa: BLE001 - a layer that does not run in float64: said in the notes
        session.skip(f"paddle's own error in '{pair.paddle}', on a float64 copy of it (torch's stands in)", exc)
        return None
    finally:
        for h in handles:
            h.remove()
    if any(y.dtype != paddle.float64 for y in ys):
        return None
    return [paddle_side.to_numpy(y) for y in ys], seen


def _own_output_errors(pair, loc, run) -> list | None:
    """The forced outputs (of `loc`, a forced.ForcedCall) less the float64 copy's (_run_float64), as
    torch's module computes them;
    None where not measured, of other shapes, or exactly equal (the copy computed in float32 inside,
    or the layer is exact)."""
    if run is None:
        return None
    ys = run[0]
    if len(ys) != len(loc.outputs) or any(y.shape != a.shape for y, a in zip(ys, loc.outputs)):
        return None
    # as torch's module computes them (a fused layer's slice, a gate's logits read as a router's
    # probabilities): a reading that is not linear must see both outputs, not their difference
    errs = [np.subtract(a, b).astype(np.float32) for a, b in zip(sliced(pair, list(loc.outputs)), sliced(pair, ys))]
    return errs if any(np.any(e) for e in errs) else None


def paddle_own_inside(session: Session, pair, passes, children, torch_own: TorchOwn) -> tuple[list | None, dict]:
    """A paired paddle layer with layers inside (an attention computing its products and its
    softmax in its own code), measured as paddle_own_errors measures a leaf: its own fp32 error at
    its outputs, and the float64 values of the floating inputs its code computes for its paired
    `children` ((torch path of the child, torch input index) -> array, its axes in torch's order, as
    differing_inputs keys them); (None, {}) where the copy does not run in float64, gives other
    shapes, or its error anywhere is beyond what rounding gives against torch's own error over the
    whole module at the same tensor (`torch_own`, torch_own_errors): a difference that runs in
    float32 alone (a branch on the dtype), not paddle's kernels. Casts to float16 and bfloat16
    inside round in the copy as in the layer: a round trip through them is the port's own."""
    loc = passes.forced_p.get(pair.paddle)
    if loc is None or not loc.outputs:
        return None, {}
    relative = {c.torch: c.paddle[len(pair.paddle):].lstrip(".") for c in children if c.paddle != pair.paddle}
    t_call, p_call = passes.t_calls[pair.torch], passes.p_calls[pair.paddle]
    # casts to float16 and bfloat16 round in the copy as in the layer: that rounding is the port's, not
    # paddle's kernels' (a round trip through float16 stays over torch's budget)
    drawn = paddle_side.random_state(session.device)
    run = _run_float64(session, pair, t_call, p_call, relative.values(), ("float32",))
    errs = _own_output_errors(pair, loc, run)
    if errs is None or torch_own.outputs is None:
        return None, {}
    if not all(_rounding_sized(e, a, torch_own.outputs) for e, a in zip(errs, sliced(pair, list(loc.outputs)))):
        return None, {}
    if paddle_side.may_differ_again(drawn, session.device):
        again = _run_float64(session, pair, t_call, p_call, relative.values(), ("float32",))
        if again is None or not _same_run(run, again):  # random inside (a dropout left on): no error of its own
            return None, {}
    inputs = {}
    for child in children:
        forced = passes.forced_p.get(child.paddle)
        seen = run[1].get(relative.get(child.torch))
        if forced is None or forced.forcing is None or seen is None:
            continue
        for m in forced.forcing.matches:
            got = forced.computed[m.index] if m.index < len(forced.computed) else None
            if m.index >= len(seen) or not isinstance(got, np.ndarray) or got.shape != seen[m.index].shape \
                    or not np.issubdtype(got.dtype, np.floating):  # positions, ids: nothing rounds there
                continue
            own = torch_own.inputs.get((child.torch, m.source), torch_own.outputs)
            if not _rounding_sized(np.subtract(got, seen[m.index], dtype=np.float64), got, own):
                return None, {}  # the copy does not compute what the layer does in float32
            # in torch's layout, as differing_inputs gives the value paddle computed
            inputs[child.torch, m.source] = seen[m.index] if m.axes is None else np.transpose(seen[m.index],
                                                                                             undone(m.axes))
    return errs, inputs


# paddle's own error inside a layer against torch's own there, beyond which it is no rounding: paddle's CPU
# kernels may reduce sequentially where torch's sum in blocks (a mean over 65536 values: 100 times torch's error)
OWN_ERROR_TIMES = 256


@dataclass
class OwnError:
    """An error's size against its values': its rms over theirs, and the largest such ratio over
    the rows (the last axis), where a difference confined to a few positions shows."""

    rms: float
    worst_row: float


@dataclass
class TorchOwn:
    """torch's own error over a whole module (torch_own_errors): at its outputs, and per (child
    path, input index) at the floating inputs its code hands its children."""

    outputs: OwnError | None
    inputs: dict = field(default_factory=dict)



def _own_error(errs: list, values: list) -> OwnError:
    """OwnError of `errs` against `values` (pairwise of one shape), over their finite elements."""
    total_e = total_v = 0.0
    worst = 0.0
    for e, v in zip(errs, values):
        e, v = np.asarray(e, dtype=np.float64), np.asarray(v, dtype=np.float64)
        kept = np.isfinite(e) & np.isfinite(v)
        e2, v2 = np.where(kept, np.square(e), 0.0), np.where(kept, np.square(v), 0.0)
        total_e, total_v = total_e + float(e2.sum()), total_v + float(v2.sum())
        rows_e, rows_v = (e2.reshape(-1, e2.shape[-1]).sum(-1), v2.reshape(-1, v2.shape[-1]).sum(-1)) if e2.ndim \
            else (e2.reshape(1), v2.reshape(1))
        valued = rows_v > 0
        if valued.any():
            worst = max(worst, float(np.sqrt(np.max(rows_e[valued] / rows_v[valued]))))
    tiny = np.finfo(np.float64).tiny
    return OwnError(float(np.sqrt(total_e / max(total_v, tiny))), worst)


def _rounding_sized(err: np.ndarray, values: np.ndarray, torch_own: OwnError) -> bool:
    """`err` is of a size rounding gives: its rms against the values', and its worst row's, at most
    OWN_ERROR_TIMES torch's own there (at least float32's unit), not a difference between what
    float32 and float64 compute (a branch on the dtype, random numbers), in all of the tensor or in
    a few of its positions."""
    if not np.issubdtype(values.dtype, np.floating) or not np.all(np.isfinite(err)) or err.shape != values.shape:
        return False
    mine = _own_error([err], [values])
    return mine.rms <= OWN_ERROR_TIMES * max(torch_own.rms, U32) \
        and mine.worst_row <= OWN_ERROR_TIMES * max(torch_own.worst_row, U32)


def _same_run(one, other) -> bool:
    """Two runs of the float64 copy gave the same outputs and inputs inside, bit for bit."""
    same = lambda a, b: len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))
    return same(one[0], other[0]) and one[1].keys() == other[1].keys() and all(same(one[1][k], other[1][k])
                                                                                for k in one[1])
