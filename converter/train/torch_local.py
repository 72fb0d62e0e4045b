"""Torch's half of a unit's local backward: the module's vector-Jacobian product on its recorded call
and output gradients, in fp32, in float64 (the reference, watched for where it narrows) and in
paddle's format."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from ..compare.capture import Call
from ..compare.precision import U32
from ..compare.replay import float64_reference
from ..compare.session import _float64_by_default
from ..frameworks import torch_side
from ..tree import flatten, is_torch_tensor, map_leaves
from .result import Skipped
from .units import Unit

NARROW_UNIT = {"float32": U32, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff


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

    def leaf(v):
        if v.is_floating_point():
            return leaves[inputs.index(v)]
        return v.cpu() if dtype == torch.float64 else v
    args, kwargs = map_leaves(call.args, leaf, is_torch_tensor), map_leaves(call.kwargs, leaf, is_torch_tensor)
    watch = _narrowing_mode()() if dtype == torch.float64 else _Unwatched()
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
            {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, watch.ops)


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


class _Unwatched(contextlib.nullcontext):
    """A run that is not watched for narrowing: it records no op."""

    ops = ()


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


@dataclass(frozen=True)
class TorchLocal:
    """Torch's half of one unit's local backward: its input and parameter gradients in fp32, float64
    and paddle's format (None where that is fp32), the condition where torch's float64 reference
    narrows, and the note that says so."""

    unit: Unit
    inputs: Inputs
    g32: list
    p32: dict
    g64: list
    p64: dict
    gf: list | None
    pf: dict | None
    cond_in: list
    cond_p: dict
    said: str


def torch_half(unit: Unit, t32, t64, tfmt) -> TorchLocal | Skipped:
    """The unit's TorchLocal, or the skip where it cannot be re-run alone on torch's inputs."""
    import torch
    call, grads, get = unit.call, unit.grads, unit.get
    inputs = Inputs(call)
    grads64 = [g.double().cpu() if g is not None else None for g in grads]
    try:
        g32, p32, _ = torch_local(get(t32), call, inputs, grads, torch.float32)
        g64, p64, narrowed = torch_local(get(t64), call, inputs, grads64, torch.float64)
        gf, pf, _ = torch_local(get(tfmt), call, inputs, grads, torch.float32) if tfmt is not None else (None, None, 0)
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        return Skipped.of(f"the local backward of '{unit.label}'", exc)
    cond_in, cond_p, said = [None] * len(g64), {}, ""
    if narrowed:  # torch's reference is not float64 there: its observed error is no measure of fp32's
        ulp = max(NARROW_UNIT.get(d, U32) for _, d in narrowed)
        moved, moved_p, _ = torch_local(get(t64), call, inputs, grads64, torch.float64, moved=2 * ulp)
        cond_in = [m - b for m, b in zip(moved, g64)]
        cond_p = {n: moved_p[n] - p64[n] for n in p64}
        said = (f"torch's float64 reference narrows to {', '.join(sorted({d for _, d in narrowed}))} in "
                f"{', '.join(op for op, _ in narrowed[:3])}: budget from its change under inputs moved by one unit "
                "in the last place of that format; ")
    return TorchLocal(unit, inputs, g32, p32, g64, p64, gf, pf, cond_in, cond_p, said)
