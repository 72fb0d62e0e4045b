"""Teacher forcing at every level in one pass per side.

In a forced pass every paired layer is called on the torch layer's recorded inputs
(its pre-hook swaps them in), so that each layer's output carries its own error
only. Before the swap, the pre-hook keeps the inputs the enclosing code computed:
compared with torch's, they show what a parent's own code (between its children)
did. One forced paddle pass gives every layer's local output; one forced float64
torch pass gives the reference for every budget (and, per format in use, one more
with matmul inputs rounded). That replaces re-running each module on its own, which
costs one whole forward per level of nesting.

To keep memory near the capture's own, each float64 pass keeps only its difference from
torch's float32 values, in float32. A rounded pass keeps it per element too: the effect of
rounding on a layer's output is far from uniform (a softmax passes it on in proportion to each
probability), so its rms alone would understate it where the output is large.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..frameworks import paddle_side, torch_side
from .capture import Call, call_tensors, stop_when_done, tensor_version
from .identity import ByIdentity, view_of
from .precision import ROUNDING_DRAWS, U32
from .matching import POSITION, VALUE, common_shape, lay_out
from .paddle_own import (TorchOwn, _layer_at, _own_error, _paddle_keeps_float64 as _paddle_keeps_float64,
                         paddle_own_errors as paddle_own_errors, paddle_own_inside as paddle_own_inside)
from .replay import Forcing, TorchCopies, to_float64, force_paddle_args, torch_inputs, with_own_state
from .shapes import undone
from ..paths import is_under
from ..tree import flatten

from .port import Session


@dataclass
class PassedOn:
    """An input that the enclosing code passed on unchanged: the paddle copy of torch's
    recorded `source`, so no numpy copy of it is made."""

    source: object
    shape: tuple


@dataclass
class ForcedCall:
    computed: list = field(default_factory=list)  # paddle: inputs as the enclosing code computed them
    outputs: list = field(default_factory=list)  # paddle: outputs on the forced inputs
    forcing: Forcing | None = None  # which paddle input took which torch input


@dataclass
class Reference:
    """float64 minus torch's float32, for a layer's outputs and for the inputs asked for (by
    index; None where an input is not floating)."""

    output_err: list = field(default_factory=list)
    input_err: dict = field(default_factory=dict)
    # elementwise layers: what one unit of float32 rounding inside the op may move its output by
    # (the op's condition; see _condition)
    condition: np.ndarray | None = None


def forced_paddle(session: Session, pairs, t_calls: dict, until: dict | None = None) -> dict[str, ForcedCall]:
    """Every paired paddle layer on torch's recorded inputs, in one paddle pass; `until` (paddle
    path -> calls; capture.stop_when_done): the pass ends once those calls have completed."""
    runs: dict[str, ForcedCall] = {}
    handed = TorchCopies()
    handles = []

    converted = ByIdentity("converted")  # each tensor converted to numpy once

    def as_numpy(value):
        version = tensor_version(value)
        array = converted.get(value, version)
        if array is None:
            array = paddle_side.to_numpy(value)
            converted.put(value, array, version)
        return array

    def as_computed(value):
        source = handed.source_of(value)
        return as_numpy(value) if source is None else PassedOn(source, tuple(value.shape))

    for pair in pairs:
        t_call = t_calls[pair.torch]
        layer = _layer_at(session.paddle_model, pair.paddle)  # hooked: its weights need not be made now

        def pre(lay, args, kwargs, _p=pair.paddle, _t=t_call):
            if _p in runs:
                return None
            run = runs[_p] = ForcedCall([as_computed(t) for t in call_tensors(args, kwargs, paddle_side.is_tensor)])
            args, kwargs, run.forcing = force_paddle_args(args, kwargs, _t, handed, as_numpy)
            return args, kwargs

        def post(lay, args, out, _p=pair.paddle):
            run = runs.get(_p)
            if run is not None and not run.outputs:
                run.outputs = [as_numpy(t) for t in flatten(out, paddle_side.is_float_tensor)]

        # first in line: it must see the inputs as computed, before any emulation rounds them
        handles += paddle_side.add_hooks(layer, pre, post, first=True)
    try:
        with stop_when_done(paddle_side, session.paddle_model, until):
            session.run_paddle(forced=True)
    finally:
        for h in handles:
            h.remove()
    return runs


def _stamp(v, r) -> tuple:
    """What an error found for the float64 tensor `v` against the recorded `r` depends on
    beyond `v` itself: r's storage and layout, and both version counters (in-place changes).
    Modules hand tensors on (a wrapper returns its child's output, a child takes its
    sibling's output or its parent's input), so each error is computed once."""
    return tensor_version(v), view_of(r), tensor_version(r)


def _errors(values, recorded, known: ByIdentity):
    """Per tensor: float64 value minus torch's float32 (as float32)."""
    out = []
    for v, r in zip(values, recorded):
        if not v.is_floating_point():
            out.append(None)
            continue
        err = known.get(v, _stamp(v, r))
        if err is None:
            err = _minus(v.detach().cpu(), r.detach().cpu())
            known.put(v, err, _stamp(v, r))
        out.append(err)
    return out


def _minus(v, r) -> np.ndarray:
    """v - r computed in float64 (r widens element by element), stored as float32: the
    difference of a float64 value and its float32 result is far inside float32's range, but at
    masked positions (float64's lowest value against float32's, HF's T5 position bias) it is
    -inf, and those positions are not compared (see matching.masked_alike)."""
    import torch
    if r.dtype not in (torch.float32, torch.float64, torch.float16):  # numpy has no bf16
        return (v - r).float().numpy()
    a, b = v.numpy(), r.numpy()
    with np.errstate(over="ignore"):
        return np.subtract(a, b, out=np.empty(np.broadcast_shapes(a.shape, b.shape), np.float32), casting="same_kind")


def differing_inputs(pairs, t_calls: dict, forced_p: dict[str, ForcedCall]) -> dict[str, list]:
    """Per torch path: (torch input index, the value paddle's enclosing code computed, torch's
    value), both laid out in their common shape (paddle's with its axes in torch's order, where the
    match gives them in another), for each input that was taken from torch
    (matched by value, or left over on both sides) where the two differ: the enclosing code
    made the difference. Inputs passed on unchanged need no check of their own: torch's
    recorded tensor (equal), or, on both sides, an output of another pair (that pair's own
    check covers it)."""
    made = {}  # id of a forced paddle output -> torch's recorded tensor for it
    for pair in pairs:
        loc = forced_p.get(pair.paddle)
        if loc is not None:
            made.update((id(a), t) for a, t in zip(loc.outputs, t_calls[pair.torch].outputs))
    out = {}
    for pair in pairs:
        loc = forced_p.get(pair.paddle)
        if loc is None or loc.forcing is None:
            continue
        recorded = torch_inputs(t_calls[pair.torch])
        found = []
        for m in loc.forcing.matches:
            if m.how not in (VALUE, POSITION):
                continue
            got, r = loc.computed[m.index], recorded[m.source]
            if isinstance(got, PassedOn):
                if got.source is r:
                    continue  # torch's own recorded tensor, handed on: equal
                got = torch_side.to_numpy(got.source)
            elif id(got) in made and view_of(made[id(got)]) == view_of(r):
                continue  # another pair's output, handed on unchanged on both sides
            if m.axes is not None:  # laid out as torch's: [B, T, C] computed where torch has [T, B, C]
                if got.ndim != len(m.axes):
                    continue
                got = np.transpose(got, undone(m.axes))
            t = torch_side.to_numpy(r)
            shape = common_shape(got.shape, t.shape)
            if shape is None:
                continue
            if tuple(got.shape) == tuple(t.shape) and np.array_equal(got, t):
                continue
            got, t = lay_out(got, shape), lay_out(t, shape)
            if not np.array_equal(got, t):
                found.append((m.source, got, t))
        if found:
            out[pair.torch] = found
    return out


def forced_torch64(session: Session, paths, t_calls: dict, fmt: str | None = None, between=None,
                   draw: int = 0, until: dict | None = None) -> dict[str, Reference]:
    """The float64 torch model, forced like the paddle side, with hooks on the modules at
    `paths`; matmul inputs rounded to `fmt` if given (see precision.torch_rounding for `draw`).
    Errors are kept for every input and output. `between()`, when given, is called before each
    module, on the thread that runs the pass. `until` (torch path -> calls;
    capture.stop_when_done): the pass ends once those calls have completed."""
    refs: dict[str, Reference] = {}
    import torch
    known = ByIdentity("known")  # errors found so far in this pass
    conditions = ByIdentity()  # float64 output -> the condition of the elementwise layer that made it
    handles = []
    for path in paths:
        t_call: Call = t_calls[path]
        module = session.torch64_module(path)

        def pre(mod, args, kwargs, _t=path, _c=t_call):
            if between is not None:
                between()
            if _t in refs:
                return None
            recorded = torch_inputs(_c)
            errs = dict(enumerate(_errors(call_tensors(args, kwargs, torch_side.is_tensor), recorded, known)))
            refs[_t] = Reference(input_err=errs)
            args64 = to_float64(with_own_state(tuple(_c.args), tuple(args)))
            kwargs64 = to_float64(with_own_state(dict(_c.kwargs), dict(kwargs)))
            for wide, r in zip(call_tensors(args64, kwargs64, torch_side.is_tensor), recorded):
                if wide.is_floating_point():  # a widened copy of r itself: no error at all
                    known.put(wide, np.broadcast_to(np.float32(0), tuple(wide.shape)), _stamp(wide, r))
            return args64, kwargs64

        def post(mod, args, out, _t=path, _c=t_call):
            ref = refs.get(_t)
            if ref is not None and not ref.output_err:
                ref.output_err = _errors(flatten(out, torch_side.is_float_tensor), _c.outputs, known)
                if fmt is None:
                    ref.condition = _condition(mod, _before(args, out, _c), out)
                    if isinstance(out, torch.Tensor):  # a wrapper returning its child's output: the child's
                        if ref.condition is None:
                            ref.condition = conditions.get(out)
                        else:
                            conditions.put(out, ref.condition)

        handles += torch_side.add_hooks(module, pre, post, first=True)
    try:
        with stop_when_done(torch_side, session.torch64, until):
            session.run_torch64(fmt, draw)
    finally:
        for h in handles:
            h.remove()
    return refs


def _before(args, out, call: Call) -> tuple:
    """A call's positional inputs as they were before it ran: where the module wrote its output
    over its input (`LeakyReLU(inplace=True)`), the widened copy of torch's recorded input, which
    is what the forced pass handed it."""
    import torch
    first = args[0] if args else None
    if isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor) and first.numel() \
            and first.data_ptr() == out.data_ptr():
        recorded = torch_inputs(call)
        if recorded and tuple(recorded[0].shape) == tuple(first.shape):
            return (recorded[0].detach().cpu().double(), *args[1:])
    return args


def _condition(module, args, out) -> np.ndarray | None:
    """For an elementwise layer (a leaf without parameters, one floating input, one output of its
    shape), per element, as float32: the hypotenuse of |f(x (1 + u32)) - f(x)| (the input's own
    rounding, carried through f; exp's |x| |y| u) and u32 |x| (rounding of intermediates as
    large as the input: GELU's 0.5 x (1 + tanh(...)) cancels to 1e-3 of x where x is -3, and
    a tanh a few units less exact, as paddle's CPU kernel is, moves the output by a few u |x|).
    None for other layers. An activation's float64 forward costs little beside the matmuls."""
    import torch
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or not args[0].is_floating_point() \
            or not isinstance(out, torch.Tensor) or out.shape != args[0].shape \
            or next(module.children(), None) is not None or next(module.parameters(), None) is not None:
        return None  # a block holds layers: its own error is judged from theirs, not re-run here
    with torch.no_grad():
        moved = module.forward(args[0] * (1.0 + U32))  # forward itself: no hooks, no recursion
    if not isinstance(moved, torch.Tensor) or moved.shape != out.shape:
        return None
    return torch.hypot(moved - out, args[0] * U32).float().numpy()


def torch_references(session: Session, paths, t_calls: dict, between=None,
                     until: dict | None = None) -> tuple[dict[str, Reference], dict]:
    """The float64 references of the torch modules at `paths` (forced there, and only there,
    as the paddle side is), and per lower-precision format in use, the effect of rounding
    matmul inputs to it. Touches only the float64 model, so it can run beside the paddle
    passes; `between()` is called before each module; `until`: as in forced_torch64."""
    return forced_torch64(session, paths, t_calls, None, between, until=until), \
        {f: rounded_torch64(session, paths, t_calls, f, between, until) for f in set(session.formats.values()) - {"fp32"}}


def rounded_torch64(session: Session, paths, t_calls: dict, fmt: str, between=None,
                    until: dict | None = None) -> dict[str, Reference]:
    """forced_torch64 rounded to `fmt`, its errors per element the rms over ROUNDING_DRAWS draws;
    one draw's errors are held at a time beside the sum."""
    squares: dict[str, Reference] = {}
    for draw in range(ROUNDING_DRAWS):
        for path, ref in forced_torch64(session, paths, t_calls, fmt, between, draw, until).items():
            total = squares.setdefault(path, Reference(input_err={i: None for i in ref.input_err}))
            total.output_err = [_add_square(t, e) for t, e in
                                zip(total.output_err or [None] * len(ref.output_err), ref.output_err)]
            total.input_err = {i: _add_square(total.input_err.get(i), e) for i, e in ref.input_err.items()}
    for ref in squares.values():
        ref.output_err = [_root_mean(t) for t in ref.output_err]
        ref.input_err = {i: _root_mean(t) for i, t in ref.input_err.items()}
    return squares


def _add_square(total, err):
    if err is None:
        return total
    sq = np.square(err, dtype=np.float64)
    return sq if total is None else np.add(total, sq, out=total) if total.shape == sq.shape else total


def _root_mean(total):
    return None if total is None else np.sqrt(total / ROUNDING_DRAWS).astype(np.float32)


def torch_own_errors(session: Session, children: dict[str, list[str]], t_calls: dict) -> dict[str, TorchOwn]:
    """Per torch module in `children` (path -> its paired children's paths), torch's own error over
    the whole module: its float64 copy forced at the module's inputs alone, so that what its code
    computes between the children, and the children, run in float64 on it; its outputs and the
    children's inputs then less torch's float32 ones. One float64 pass for modules none of which
    holds another (a module forced inside another would cut what the outer one computes)."""
    out, left = {}, sorted(children, key=len)
    while left:
        group = [p for i, p in enumerate(left) if not any(is_under(p, q) for q in left[:i])]
        left = [p for p in left if p not in group]
        seen, handles = {}, []
        for child in {c for p in group for c in children[p] if c != p and c in t_calls}:
            def pre(module, args, kwargs, _c=child, _seen=seen):
                if _c not in _seen:
                    _seen[_c] = [t.detach().cpu().double().numpy() if t.is_floating_point() else None
                                for t in call_tensors(args, kwargs, torch_side.is_tensor)]
            handles += torch_side.add_hooks(session.torch64_module(child), pre)
        try:
            refs = forced_torch64(session, group, t_calls, until={p: 1 for p in group})
        finally:
            for h in handles:
                h.remove()
        for path in group:
            ref = refs.get(path)
            values = [torch_side.to_numpy(v) for v in t_calls[path].outputs]
            own = TorchOwn(None if ref is None else _own_error([e for e in ref.output_err if e is not None], values))
            for child in children[path]:
                recorded = [torch_side.to_numpy(t) for t in torch_inputs(t_calls[child])] if child in t_calls else []
                for i, (wide, r) in enumerate(zip(seen.get(child, []), recorded)):
                    if wide is not None and wide.shape == r.shape and np.issubdtype(r.dtype, np.floating):
                        own.inputs[child, i] = _own_error([np.subtract(wide, r, dtype=np.float64)], [r])
            out[path] = own
    return out
