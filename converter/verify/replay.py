"""Teacher forcing: re-run one layer on the torch layer's recorded inputs.

The paddle layer is called with its own recorded call structure (positional and
keyword arguments), with each floating tensor replaced by the torch call's
tensor in the same position and of the same shape. The torch layer is re-run in
float64 (and, on request, with its matmul inputs rounded to a format) to give
the reference that calibrates the budget.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .budget import MatmulStats
from ..frameworks import paddle_side, torch_side
from .capture import Call, call_tensors, flatten
from .identity import ByIdentity
from .precision import cpu_has_native_bf16, round_torch_matmuls


def torch_inputs(call: Call) -> list:
    """The tensors a recorded torch call received."""
    return call_tensors(call.args, call.kwargs, torch_side.is_tensor)


def forced_paddle_inputs(t_call: Call, p_call: Call):
    """paddle (args, kwargs) holding torch's recorded tensors; None when they cannot be matched."""
    args, kwargs, missing = force_paddle_args(tuple(p_call.args), dict(p_call.kwargs), t_call)
    return None if missing else (args, kwargs)


class Handed:
    """Paddle copies of torch's recorded tensors handed to layers during one forced pass. A
    parent that passes its own input on to a child hands the child the same copy, so it is
    made once; and a copy's torch source can be looked up. A copy lives only as long as the
    forward holds it."""

    def __init__(self):
        self._copies = ByIdentity()  # torch tensor -> its copy, by weak reference
        self._sources = ByIdentity()  # copy -> its torch tensor

    def copy_of(self, tensor, like):
        """`tensor` (torch) as a paddle tensor on `like`'s place, in `like`'s dtype."""
        return self._copies.made(tensor, lambda: self._copy(tensor, like),
                                 usable=lambda c: c.dtype == like.dtype and str(c.place) == str(like.place))

    def _copy(self, tensor, like):
        import paddle
        import torch
        array = tensor.detach().cpu()
        array = array.float().numpy() if array.dtype == torch.bfloat16 else array.numpy()
        copy = paddle.to_tensor(array, place=like.place)
        copy = copy.astype(like.dtype) if copy.dtype != like.dtype else copy
        self._sources.put(copy, tensor)
        return copy

    def source_of(self, value):
        """The torch tensor that the paddle tensor `value` is a copy of, or None."""
        return self._sources.get(value)


def force_paddle_args(args: tuple, kwargs: dict, t_call: Call, handed: Handed | None = None):
    """(args, kwargs, unmatched count): each paddle tensor replaced by the torch call's tensor
    of the same shape, taken in order."""
    import paddle
    handed = handed or Handed()
    pool = torch_inputs(t_call)
    used = [False] * len(pool)
    missing = []
    swapped = {}  # one paddle tensor passed several times (q = k = v) takes one torch tensor

    def swap(value):
        if isinstance(value, paddle.Tensor) and id(value) in swapped:
            return swapped[id(value)]
        if isinstance(value, paddle.Tensor):
            out = _take(value)
            swapped[id(value)] = out
            return out
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        return value

    def _take(value):
        for i, t in enumerate(pool):
            if not used[i] and tuple(t.shape) == tuple(value.shape):
                used[i] = True
                return handed.copy_of(t, value)
        missing.append(tuple(value.shape))
        return value

    return swap(tuple(args)), swap(dict(kwargs)), len(missing)


def to_numpy_list(outputs, framework: str) -> list[np.ndarray]:
    """Floating tensors as numpy, float32 at least (float64 stays float64)."""
    convert = torch_side.to_numpy if framework == "torch" else paddle_side.to_numpy
    return [convert(t) for t in outputs]


def run_paddle(layer, args, kwargs) -> list[np.ndarray]:
    import paddle
    with paddle.no_grad():
        out = layer(*args, **kwargs)
    return to_numpy_list(flatten(out, paddle_side.is_float_tensor), "paddle")


def _to64(value, widen=None):
    """`value` with its floating tensors widened to float64 (by `widen` when given) and moved to
    the CPU."""
    import torch
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return value.cpu()
        return widen(value) if widen is not None else value.detach().cpu().double()
    if isinstance(value, (list, tuple)):
        return type(value)(_to64(v, widen) for v in value)
    if isinstance(value, dict):
        return {k: _to64(v, widen) for k, v in value.items()}
    return value


@contextlib.contextmanager
def rounded(module, fmt: str | None):
    """Inside the block, `module`'s matmul layers round their inputs and weights to `fmt`."""
    import torch
    if fmt in (None, "fp32"):
        yield
        return
    saved, handles = round_torch_matmuls(module, fmt)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for m, w in saved:
                m.weight.copy_(w)


def run_torch64(module64, call: Call, fmt: str | None = None) -> list[np.ndarray]:
    import torch
    with torch.no_grad(), rounded(module64, fmt):
        out = module64(*_to64(call.args), **_to64(call.kwargs))
    return to_numpy_list(flatten(out, torch_side.is_float_tensor), "torch")


def matmul_stats(module, call: Call, s2_dtype=None) -> MatmulStats | None:
    """S2 = sum_k (x_k w_k)^2 per output element (float32), and K, for torch matmul layers.

    A budget needs S2's magnitude, not its last digits: by default the squares are rounded to
    bf16 (8 bits, float32's range) and summed in float32 by the bf16 kernels, which puts S2
    within 2%, where the CPU has bf16 matrix units (several times faster there); float32
    elsewhere (on a GPU, on the GPU). `s2_dtype` overrides the choice."""
    import torch
    import torch.nn.functional as F
    names = {c.__name__ for c in type(module).__mro__}
    if not call.args or not isinstance(call.args[0], torch.Tensor) or getattr(module, "weight", None) is None:
        return None
    x, w = call.args[0].detach(), module.weight.detach()  # on the device they ran on
    if s2_dtype is None:
        s2_dtype = torch.bfloat16 if x.device.type == "cpu" and cpu_has_native_bf16() else torch.float32
    x2, w2 = _squared(x, s2_dtype), _squared(w.to(x.device), s2_dtype)
    as_stats = lambda s2, k: MatmulStats(s2.float().cpu().numpy(), k)
    with torch.no_grad():
        if "Linear" in names:
            return as_stats(F.linear(x2, w2), module.in_features)
        if "Conv1D" in names and "Conv1d" not in names:  # HF GPT-2: weight [in, out]
            return as_stats(x2 @ w2, w2.shape[0])
        kernel = float(np.prod(module.kernel_size))
        if names & {"Conv1d", "Conv2d", "Conv3d"}:
            return as_stats(module._conv_forward(x2, w2, None), module.in_channels / module.groups * kernel)
        if names & {"ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"}:
            fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(module.kernel_size)]
            s2 = fn(x2, w2, None, module.stride, module.padding, module.output_padding, module.groups, module.dilation)
            return as_stats(s2, max(module.in_channels / module.groups * kernel / float(np.prod(module.stride)), 1.0))
    return None


def _squared(t, dtype):
    """t * t in `dtype`, never in place on `t` itself."""
    return t.square() if t.dtype == dtype else t.to(dtype).square_()
