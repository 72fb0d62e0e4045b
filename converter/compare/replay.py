"""Teacher forcing: re-run one layer on the torch layer's recorded inputs.

The paddle layer is called with its own recorded call structure (positional and
keyword arguments), with each floating tensor replaced by the torch call's
tensor in the same position and of the same shape. The torch layer is re-run in
float64 (and, on request, with its matmul inputs rounded to a format) to give
the reference that calibrates the budget.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from .budget import MatmulStats
from ..frameworks import paddle_side, torch_side
from .capture import Call, call_tensors, replace_call_tensors, tensor_version
from .identity import ByIdentity
from .masks import in_form_of
from .matching import JOINED, MASK, POSITION, VALUE, describe, fit, in_layout, joined, match_inputs
from ..families import lookup
from .precision import cpu_has_native_bf16, torch_rounding
from ..tree import flatten, is_torch_tensor, map_leaves

from .port import Session


def torch_inputs(call: Call) -> list:
    """The tensors a recorded torch call received."""
    return call_tensors(call.args, call.kwargs, torch_side.is_tensor)


def paddle_inputs(call: Call) -> list:
    """The tensors a recorded paddle call received."""
    return call_tensors(call.args, call.kwargs, paddle_side.is_tensor)


def forced_paddle_inputs(t_call: Call, p_call: Call):
    """paddle (args, kwargs) holding torch's recorded tensors where they match paddle's inputs
    by value (see matching.py); the others stay as paddle's call had them."""
    return force_paddle_args(tuple(p_call.args), dict(p_call.kwargs), t_call)[:2]


class TorchCopies:
    """Paddle copies of torch's recorded tensors handed to layers during one forced pass. A
    parent that passes its own input on to a child hands the child the same copy, so it is
    made once; and a copy's torch source can be looked up. A copy lives only as long as the
    forward holds it."""

    def __init__(self):
        self._copies = ByIdentity()  # torch tensor -> its copy, by weak reference
        self._sources = ByIdentity()  # copy -> its torch tensor

    def copy_of(self, tensor, like, axes: tuple | None = None):
        """`tensor` (torch) as a paddle tensor of `like`'s shape (same values, broadcast; with its
        axes in the order `axes` first, where given), on its place, in its dtype."""
        return self._copies.weakly_kept(tensor, lambda: self._copy(tensor, like, axes), stamp=axes,
                                        usable=lambda c: c.dtype == like.dtype and str(c.place) == str(like.place)
                                        and tuple(c.shape) == tuple(like.shape) and self.origin(c) is not None)

    def _copy(self, tensor, like, axes):
        array = torch_side.to_numpy(tensor)
        copy = _paddle_like(fit(array if axes is None else np.transpose(array, axes), tuple(like.shape)), like)
        self._sources.put(copy, (tensor, tensor_version(copy), axes))
        return copy

    def origin(self, value) -> tuple | None:
        """(torch tensor, order of its axes or None) that the paddle tensor `value` is a copy of,
        or None (also once a layer has changed the copy in place: it then holds what that layer
        computed)."""
        found = self._sources.get(value)
        if found is None or tensor_version(value) != found[1]:
            return None
        return found[0], found[2]

    def source_of(self, value):
        """The torch tensor that the paddle tensor `value` is a copy of, as it is (not with its
        axes in another order), or None."""
        found = self.origin(value)
        return found[0] if found is not None and found[1] is None else None


@dataclass
class Forcing:
    """How one paddle call was forced: a match per paddle input tensor (see matching.py)."""

    matches: list = field(default_factory=list)
    shapes: list = field(default_factory=list)

    @property
    def note(self) -> str:
        return describe(self.matches, self.shapes)


def force_paddle_args(args: tuple, kwargs: dict, t_call: Call, handed: TorchCopies | None = None,
                      as_numpy=None):
    """(args, kwargs, Forcing): each paddle tensor that matches one of the torch call's tensors
    by value replaced by (a paddle copy of) that torch tensor; the rest left as they are.
    `as_numpy(paddle tensor)` converts (and may cache); `handed` knows which paddle tensors are
    copies of which torch tensors already."""
    handed = handed or TorchCopies()
    as_numpy = as_numpy or paddle_side.to_numpy
    pool = torch_inputs(t_call)
    values = call_tensors(args, kwargs, paddle_side.is_tensor)
    index_of = {id(t): i for i, t in enumerate(pool)}
    same = {}
    for j, v in enumerate(values):
        found = handed.origin(v)
        if found is not None and id(found[0]) in index_of:
            same[j] = (index_of[id(found[0])], found[1])
    torch_arrays = [torch_side.to_numpy(t) for t in pool]
    matches = match_inputs([(lambda v=v: _paddle_array(v, handed, as_numpy)) for v in values], torch_arrays, same)
    new = {m.index: handed.copy_of(pool[m.source], values[m.index], m.axes) for m in matches
           if m.how in (VALUE, POSITION)
           and fit(in_layout(torch_arrays[m.source], m), tuple(values[m.index].shape)) is not None}
    new.update((m.index, _paddle_like(joined(torch_arrays, m), values[m.index])) for m in matches if m.how == JOINED)
    for m in matches:
        if m.how == MASK:  # torch's mask in the form paddle's layer reads
            mask = in_form_of(torch_arrays[m.source], _paddle_array(values[m.index], handed, as_numpy))
            if mask is not None:
                new[m.index] = _paddle_like(mask, values[m.index])
    args, kwargs = replace_call_tensors(args, kwargs, paddle_side.is_tensor, new)
    return args, kwargs, Forcing(matches, [tuple(v.shape) for v in values])


def _paddle_like(array: np.ndarray, like):
    """`array` as a paddle tensor on `like`'s place, in its dtype."""
    import paddle
    tensor = paddle.to_tensor(np.ascontiguousarray(array), place=like.place)
    return tensor.astype(like.dtype) if tensor.dtype != like.dtype else tensor


def _paddle_array(value, handed: TorchCopies, as_numpy):
    """A paddle tensor's values as numpy: its torch source's where it is a copy of one."""
    found = handed.origin(value)
    if found is None:
        return as_numpy(value)
    array = torch_side.to_numpy(found[0])
    return fit(array if found[1] is None else np.transpose(array, found[1]), tuple(value.shape))


def to_numpy_list(outputs, framework: str) -> list[np.ndarray]:
    """Floating tensors as numpy, float32 at least (float64 stays float64)."""
    convert = torch_side.to_numpy if framework == "torch" else paddle_side.to_numpy
    return [convert(t) for t in outputs]


def _fresh(args, kwargs, is_tensor) -> tuple[tuple, dict]:
    """A call's inputs with every tensor copied: a layer that changes its input in place (x.add_)
    must not change what was recorded, which other checks run on again."""
    tensors = call_tensors(args, kwargs, is_tensor)
    return replace_call_tensors(args, kwargs, is_tensor, {k: t.detach().clone() for k, t in enumerate(tensors)})


def run_paddle(layer, args, kwargs) -> list[np.ndarray]:
    import paddle
    args, kwargs = _fresh(args, kwargs, paddle_side.is_tensor)
    with paddle.no_grad():
        out = layer(*args, **kwargs)
    return to_numpy_list(flatten(out, paddle_side.is_float_tensor), "paddle")


def to_float64(value):
    """`value` with its floating tensors widened to float64 and its tensors moved to the CPU."""
    return map_leaves(value, lambda t: t.detach().cpu().double() if t.is_floating_point() else t.cpu(), is_torch_tensor)


PLAIN = (bool, int, float, complex, str, bytes, type(None))


def float64_kernels(model64):
    """The float64 copy of a torch model, set to run where its kernels have no float64 form: HF 5's
    MoE experts default to `grouped_mm` ("Expected mat_a to be Float32, BFloat16 or Float16
    matrix, got Double"), so the copy's experts take the eager implementation (the same sums, in a
    loop over the experts). The model verified keeps its own."""
    for module in model64.modules():
        config = getattr(module, "config", None)
        chosen = getattr(config, "_experts_implementation", None)
        if chosen not in (None, "eager") and callable(getattr(module, "set_experts_implementation", None)):
            module.set_experts_implementation("eager")
    return model64


def with_own_state(recorded, live):
    """A recorded call's inputs (args or kwargs) for a pass of another model (the float64 copy):
    its tensors and plain values as recorded; every other object, which may hold state (HF's
    DynamicCache, which each attention layer extends with its keys and values), the passing
    model's own, where its call has one of the same type at the same place. The recorded one
    belongs to the fp32 run and already holds that run's keys: shared, the float64 pass would
    attend over both runs' positions."""
    from ..tree import _children, _rebuild
    if is_torch_tensor(recorded) or isinstance(recorded, PLAIN) or type(live) is not type(recorded) \
            or live is recorded:
        return recorded
    items, others = _children(recorded), _children(live)
    if items is None:
        return live
    if others is None:
        return recorded
    other = dict(others)
    return _rebuild(recorded, [(k, with_own_state(v, other[k]) if k in other else v) for k, v in items])


@contextlib.contextmanager
def float64_reference(fmt: str | None = None, draw: int = 0):
    """The block is a float64 reference run on this thread: casts to a lower float precision give
    float64 (HF's RMSNorm computes in float32 whatever its input, so its "float64" output was a
    float32 one and its budget collapsed to the output rounding; HF Llama's rotary casts its
    integer positions and its float64 inverse frequencies with .float(): both float64; a tensor
    made in the default float dtype is float64 too), and
    every product rounds its inputs to `fmt` when given (see precision.torch_rounding)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    lower = (torch.float32, torch.float16, torch.bfloat16)
    aten = torch.ops.aten
    to_copy = aten._to_copy.default
    # tensors made from nothing in the default float dtype (HF BART's causal mask, torch.full(...,
    # finfo(float64).min), overflowed float32): float64 too, on this thread only
    made = {aten.zeros.default, aten.ones.default, aten.empty.memory_format, aten.rand.default, aten.randn.default}
    full = aten.full.default

    def floats(func, args, kwargs) -> bool:
        if "dtype" in kwargs:
            return kwargs["dtype"] in lower
        return func in made or (func is full and isinstance(args[1], float))

    class KeepFloat64(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if (func is to_copy and kwargs.get("dtype") in lower) or ((func in made or func is full)
                                                                    and floats(func, args, kwargs)):
                kwargs = dict(kwargs, dtype=torch.float64)  # any cast to, or tensor made in, a float format
            return func(*args, **kwargs)

    with KeepFloat64():
        if fmt in (None, "fp32"):
            yield
        else:
            with torch_rounding(fmt, ("float32", "float64"), draw):
                yield


def run_torch_module(module, call: Call) -> list[np.ndarray]:
    """A torch module (as it is: its device, its dtype) on a call's inputs."""
    import torch
    args, kwargs = _fresh(call.args, call.kwargs, torch_side.is_tensor)
    with torch.no_grad():
        out = module(*args, **kwargs)
    return to_numpy_list(flatten(out, torch_side.is_float_tensor), "torch")


def torch_call_on(t_call: Call, p_call: Call) -> tuple[Call, Call]:
    """torch's recorded call with its tensors replaced by the inputs paddle's layer received,
    where they match by value (see matching.py): (as torch recorded them: dtype and device;
    in float64 on the CPU)."""
    import torch
    pool = [paddle_side.to_numpy(v) for v in paddle_inputs(p_call)]
    mine = torch_inputs(t_call)
    matches = match_inputs([torch_side.to_numpy(t) for t in mine], pool)
    new = {}
    for m in matches:
        array = None
        if m.how in (VALUE, POSITION):
            array = fit(in_layout(pool[m.source], m), tuple(mine[m.index].shape))
        elif m.how == MASK:  # paddle's mask in the form torch's module reads
            array = in_form_of(pool[m.source], torch_side.to_numpy(mine[m.index]))
        if array is not None:
            new[m.index] = torch.from_numpy(np.array(array)).to(mine[m.index].dtype).to(mine[m.index].device)
    args, kwargs = replace_call_tensors(t_call.args, t_call.kwargs, torch_side.is_tensor, new)
    call = Call(t_call.path, t_call.type, t_call.start, t_call.end, args, kwargs)
    return call, Call(t_call.path, t_call.type, t_call.start, t_call.end, to_float64(args), to_float64(kwargs))


def run_torch64(module64, call: Call, fmt: str | None = None, draw: int = 0) -> list[np.ndarray]:
    import torch
    with torch.no_grad(), float64_reference(fmt, draw):
        out = module64(*to_float64(call.args), **to_float64(call.kwargs))
    return to_numpy_list(flatten(out, torch_side.is_float_tensor), "torch")


def refused_in(session: Session, path: str):
    """matmul_stats' `refused` for torch's layer at `path`: kept in the session's skipped measurements."""
    return lambda exc: session.skip(f"the input-rounding statistics of '{path}' (the generic budget stands in)", exc)


def matmul_stats(module, call: Call, square_dtype=None, refused=None) -> MatmulStats | None:
    """S2 = sum_k (x_k w_k)^2 per output element (float32), and K, for the torch layers whose
    family says a format rounds their inputs (see families/: each family computes its own);
    None for any other layer, and for a call its family cannot take (the generic budget then).

    A budget needs S2's magnitude, not its last digits: by default the squares are rounded to
    bf16 (8 bits, float32's range) and summed in float32 by the bf16 kernels, which puts S2
    within 2%, where the CPU has bf16 matrix units (several times faster there); float32
    elsewhere (on a GPU, on the GPU). `square_dtype` overrides the choice. `refused(exc)`, when given, is
    told of a call the family's formula refuses."""
    import torch
    family = lookup(module)
    if family is None or family.products is None or getattr(module, "weight", None) is None \
            or not call.args or not isinstance(call.args[0], torch.Tensor):
        return None
    x = call.args[0].detach()  # on the device it ran on
    if square_dtype is None:
        square_dtype = torch.bfloat16 if x.device.type == "cpu" and cpu_has_native_bf16() else torch.float32
    square = lambda t: _squared(t.detach(), square_dtype)
    with torch.no_grad():
        try:
            s2, k = family.products(module, call.args, _squared(module.weight.detach().to(x.device), square_dtype), square)
        except Exception as exc:  # noqa: BLE001 - a call the family's formula does not fit: the generic budget serves
            if refused is not None:
                refused(exc)
            return None
    return MatmulStats(s2.float().cpu().numpy(), float(k))


def _squared(t, dtype):
    """t * t in `dtype`, never in place on `t` itself."""
    return t.square() if t.dtype == dtype else t.to(dtype).square_()
