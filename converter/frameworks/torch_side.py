"""The torch adapter: the same functions as paddle_side."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..io.base import TensorInfo
from . import hooks
from ..lazy import import_torch


def float64_copy(model):
    """A copy of `model` on the CPU whose floating parameters and buffers are float64, each widened
    from the original one at a time (a deep copy then .double() would hold a float32 copy of the
    whole model on the way); tied tensors stay tied."""
    import copy
    import itertools
    torch = import_torch()
    memo = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) in memo:
            continue
        wide = t.detach().to("cpu", torch.float64 if t.is_floating_point() else t.dtype, copy=True)
        memo[id(t)] = torch.nn.Parameter(wide, t.requires_grad) if isinstance(t, torch.nn.Parameter) else wide
    return copy.deepcopy(model, memo).double().cpu()


def state_dict_infos(model) -> dict[str, TensorInfo]:
    return {k: TensorInfo(k, dtypes.torch_name(v.dtype), tuple(v.shape)) for k, v in model.state_dict().items()}


def to_numpy(tensor) -> np.ndarray:
    """A tensor as numpy on the CPU; floating tensors narrower than float32 widened to float32."""
    torch = import_torch()
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float64):
        tensor = tensor.float()
    return tensor.numpy()


def to_bytes(tensor) -> tuple[np.ndarray, tuple]:
    """A tensor's values as bytes on the CPU (uint8, its dtype's own bits), and what from_bytes
    needs to make the tensor again: (dtype, device)."""
    torch = import_torch()
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy(), (tensor.dtype, tensor.device)


def from_bytes(data: np.ndarray, shape: tuple, made: tuple):
    """The tensor whose to_bytes gave `data` (uint8, writable; the CPU tensor is made on it) and `made`."""
    torch = import_torch()
    dtype, device = made
    # (numpy gives an empty array a stride torch will not reinterpret)
    tensor = torch.from_numpy(data).view(dtype).reshape(shape) if data.size else torch.empty(shape, dtype=dtype)
    return tensor if tensor.device == device else tensor.to(device)


def is_tensor(value) -> bool:
    return isinstance(value, import_torch().Tensor)


def is_float_tensor(value) -> bool:
    return is_tensor(value) and value.is_floating_point()


def named_layers(model) -> list:
    """(path, module) for the model and every module inside it, the model's path being ""."""
    return list(model.named_modules())


def add_hooks(layer, pre=None, post=None, first=False) -> list:
    """Hooks on one module (see frameworks.hooks); the handles, to remove them."""
    return hooks(layer, pre, post, first, "register_forward_hook")


def forward(model, inputs, device: str):
    """The model on the spec's inputs (a dict of keyword arrays or a tuple of positional ones)."""
    torch = import_torch()
    to = lambda a: torch.from_numpy(np.array(a)).to(device)
    with torch.no_grad():
        if isinstance(inputs, dict):
            return model(**{k: to(v) for k, v in inputs.items()})
        return model(*[to(v) for v in inputs])
