"""A unit's local backward run on each side, on torch's recorded inputs and output gradients: torch's
module (its vector-Jacobian product in fp32, in float64, the reference, watched for where it narrows,
and in paddle's format); paddle's layer called as paddle's own forward called it, each tensor replaced
by the torch input holding the same values (as the forward check forces a layer), with torch's output
gradients shaped to its outputs; and paddle's own error, against a float64 copy of the layer."""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from ..compare.capture import Call
from ..compare.forced import _paddle_keeps_float64
from ..compare.replay import TorchCopies, float64_reference, force_paddle_args
from ..compare.session import _float64_by_default
from ..frameworks import paddle_side, torch_side
from ..tree import flatten, is_paddle_tensor, is_torch_tensor, map_leaves
from ..results import Skipped


class Inputs:
    """A recorded torch call's floating inputs, those holding the same values taken as one input
    (in order of first use): its gradient is the sum over every place it was passed."""

    def __init__(self, call: Call):
        import torch
        self.groups: list[list] = []
        for t in flatten((call.args, call.kwargs)):
            if any(t is u for g in self.groups for u in g):
                continue
            group = next((g for g in self.groups if g[0].shape == t.shape and torch.equal(g[0], t)), None)
            if group is None:
                self.groups.append([t])
            else:
                group.append(t)

    def index(self, tensor) -> int | None:
        return next((i for i, g in enumerate(self.groups) if any(tensor is u for u in g)), None)


def torch_local(module, call: Call, inputs: Inputs, grads: list, dtype, moved: float = 0.0):
    """(input gradients, one per input of `inputs`; {param name: gradient}; the ops that gave a
    narrower float from float64, in a float64 run) of torch's module on the recorded call; `moved`:
    each input moved first by that relative amount, with a fixed random sign per element."""
    import torch
    leaves = [g[0].to(dtype).cpu() if dtype == torch.float64 else g[0].clone() for g in inputs.groups]
    if moved:
        signs = np.random.default_rng(0)
        leaves = [t * (1.0 + moved * torch.from_numpy(signs.choice([-1.0, 1.0], tuple(t.shape))).to(t.dtype))
                  for t in leaves]
    leaves = [t.requires_grad_(True) for t in leaves]
    # the module is handed one copy of each leaf, inside the graph: a module that works in place on its
    # input (ReLU6(inplace=True)) may, where on a leaf that requires its gradient torch refuses
    handed = [t.clone() for t in leaves]

    def leaf(v):
        if v.is_floating_point():
            return handed[inputs.index(v)]
        return v.cpu() if dtype == torch.float64 else v
    args, kwargs = map_leaves(call.args, leaf, is_torch_tensor), map_leaves(call.kwargs, leaf, is_torch_tensor)
    watch = _narrowing_mode()() if dtype == torch.float64 else contextlib.nullcontext()  # (this records no op)
    with watch:
        with _reference(dtype):
            outs = flatten(module(*args, **kwargs))
        params = dict(module.named_parameters())
        targets = leaves + list(params.values())
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        # the backward as the forward's graph says: a cast's gradient goes back to the dtype its input had
        got = torch.autograd.grad([o for o, _ in pairs], targets, [g.to(o.dtype).to(o.device) for o, g in pairs],
                                  allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape)) if g is None else torch_side.to_numpy(g)
    n = len(leaves)
    return ([as_np(g, t) for g, t in zip(got[:n], leaves)],
            {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, getattr(watch, "ops", ()))


@contextlib.contextmanager
def _reference(dtype):
    """A float64 forward under the forward check's float64 guarantees (casts to a lower float format
    and tensors made in the default dtype stay float64: HF's RMSNorm computes in float32 whatever
    its input); any other run as it is."""
    import torch
    if dtype != torch.float64:
        yield
        return
    with float64_reference(), _float64_by_default():
        yield


@functools.cache
def _narrowing_mode() -> type:
    """The class of a dispatch mode whose `ops` lists each op (once, with the format) that gave a
    floating tensor narrower than float64 from a float64 input: where a float64 run's reference is
    not float64 (torch imported when first asked for)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Narrowing(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            narrow = [t.dtype for t in (out if isinstance(out, (tuple, list)) else (out,))
                      if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64]
            if narrow and any(t.dtype == torch.float64 for t in flatten((args, kwargs))):  # the inputs only then
                for dtype in narrow:
                    found = (str(func), str(dtype).removeprefix("torch."))
                    if found not in self.ops:
                        self.ops.append(found)
            return out
    return Narrowing


class Unpaired(Exception):
    """A layer whose outputs do not correspond on the two sides: it is left out, the message says why."""


class WrongCotangent(RuntimeError):
    """A gradient about to be handed to a framework for an output of another shape: this package's
    own error (an internal error), never computed on."""


def paddle_call(call: Call, p_call):
    """(args, kwargs, {paddle tensor id: torch tensor}) for the paddle layer: its own recorded call
    with each tensor replaced by the torch input holding the same values; torch's call converted
    where paddle's forward did not call the layer."""
    import paddle
    if p_call is not None:
        handed = TorchCopies()
        args, kwargs, _ = force_paddle_args(tuple(p_call.args), dict(p_call.kwargs), call, handed)
        sources = {id(t): handed.source_of(t) for t in flatten((args, kwargs), is_paddle_tensor)}
        return args, kwargs, {k: v for k, v in sources.items() if v is not None}
    copies = {}

    def convert(v):
        if id(v) not in copies:
            copies[id(v)] = (paddle.to_tensor(v.cpu().numpy()), v)
        return copies[id(v)][0]
    args, kwargs = map_leaves(call.args, convert, is_torch_tensor), map_leaves(call.kwargs, convert, is_torch_tensor)
    return args, kwargs, {id(p): t for p, t in copies.values()}


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """A gradient of a broadcast copy summed back to the shape it was broadcast from."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead > 0 else grad
    axes = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def paddle_local(layer, forced: tuple, inputs, grads: list, wide: bool = False):
    """(input gradients, one per input of `inputs` (Inputs), None where paddle's call does
    not take it; {param name: gradient}; forward outputs) of the paddle layer on torch's recorded inputs
    (`forced`: what paddle_call made of them); with `wide`, the layer (a float64 copy of it) in float64,
    casts inside kept float64."""
    import paddle
    args, kwargs, sources = forced
    fresh = {}

    def leaf(t):  # each copy of a torch input a new leaf for this run (a widened copy is one already)
        c = t.astype("float64") if wide and t.dtype == paddle.float32 else t
        if id(t) in sources:
            c = c if wide else c.detach().clone()
            fresh[id(c)] = sources[id(t)]
        return c
    args, kwargs = map_leaves(args, leaf, is_paddle_tensor), map_leaves(kwargs, leaf, is_paddle_tensor)
    leaves, where = [], []
    for t in flatten((args, kwargs)):
        i = inputs.index(fresh[id(t)]) if id(t) in fresh else None
        if i is not None and not any(t is u for u in leaves):
            t.stop_gradient = False
            leaves.append(t)
            where.append(i)
    with _paddle_keeps_float64() if wide else contextlib.nullcontext():
        outs = flatten(layer(*args, **kwargs))
        forward = [paddle_side.to_numpy(o) for o in outs]
        params = {n: p for n, p in layer.named_parameters() if not p.stop_gradient}
        pairs = [(o, paddle_grad(g, o, i)) for i, (o, g) in enumerate(zip(outs, grads))
                 if g is not None and not o.stop_gradient]
        for o, g in pairs:  # paddle.grad reads a cotangent of another size out of bounds: never hand it one
            if tuple(g.shape) != tuple(o.shape):
                raise WrongCotangent(f"a gradient of shape {list(g.shape)} for an output of shape {list(o.shape)}")
        targets = leaves + list(params.values())
        got = paddle.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape), np.float32) if g is None else np.array(paddle_side.to_numpy(g))
    n = len(leaves)
    per_input = [None] * len(inputs.groups)
    for i, g, t in zip(where, got[:n], leaves):
        g = unbroadcast(as_np(g, t), tuple(inputs.groups[i][0].shape))
        per_input[i] = g if per_input[i] is None else per_input[i] + g
    return per_input, {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, forward


def cotangent(grad: np.ndarray, shape: tuple) -> np.ndarray | None:
    """Torch's gradient of an output as the gradient of paddle's output of `shape` holding the same
    values: as it is; spread evenly over the copies where paddle's output is torch's broadcast (HF
    BERT's position embeddings of positions [1, T] against PaddleNLP's [B, T]: each copy takes its
    share, so the parameters' gradient is torch's); summed over the copies where torch's is
    paddle's broadcast; reshaped where they hold the same elements in another shape (a layer run on
    [B*T, H] against [B, T, H]); None where the shapes do not correspond."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    try:
        spread = np.broadcast_shapes(grad.shape, shape) == shape
    except ValueError:
        spread = False
    if spread:
        return np.broadcast_to(grad, shape) / (math.prod(shape) // max(grad.size, 1))
    summed = unbroadcast(grad, shape) if len(shape) <= grad.ndim else None
    if summed is not None and summed.shape == shape:
        return summed
    return grad.reshape(shape) if grad.size == math.prod(shape) else None


def paddle_grad(grad, out, i: int):
    """Torch's output gradient as the gradient of paddle's output `out` (its i-th), shaped to it
    (see cotangent) and in its dtype (its width kept, as torch's own backward takes it in the
    output's dtype)."""
    import paddle
    g = torch_side.to_numpy(grad)
    shaped = cotangent(g, tuple(out.shape))
    if shaped is None:
        raise Unpaired(f"its output {i} is {list(out.shape)} on paddle's side against torch's {list(g.shape)}")
    g = paddle.to_tensor(np.ascontiguousarray(shaped))
    return g if g.dtype == out.dtype else g.astype(out.dtype)


def paddle_own(player64, forced, inputs, grads64, gp, pp, where: str) -> tuple[list, dict, Skipped | None]:
    """Paddle's own fp32 error of the layer's gradients (its kernels reduce in orders of their own,
    which torch's observed error does not show): its gradients minus those of a float64 copy of the
    layer on the same inputs, per input and per parameter; None (torch's error stands in) where the
    copy does not run in float64 (and the skip, said) or its gradient comes out exactly equal
    (computed in float32 inside)."""
    if player64 is None:
        return [None] * len(gp), {}, None
    try:
        w_in, w_p, _ = paddle_local(player64, forced, inputs, grads64, wide=True)
    except WrongCotangent:
        raise
    except Exception as exc:  # a layer that does not run in float64: not measured, said so
        return [None] * len(gp), {}, Skipped.of(f"paddle's own error of the gradients of '{where}' in float64 "
                                                "(torch's error stands in for it)", exc)
    own = lambda a, b: None if a is None or b is None or a.shape != b.shape or np.array_equal(a, b) \
        else np.subtract(a, b, dtype=np.float64).astype(np.float32)
    return [own(a, b) for a, b in zip(gp, w_in)], {n: e for n in pp if (e := own(pp[n], w_p.get(n))) is not None}, None
