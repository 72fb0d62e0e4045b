"""The torch adapter: the same functions as paddle_side."""

from __future__ import annotations

import contextlib

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


def values_of(tensor) -> tuple[object, object, tuple]:
    """For a spill (compare/spill.py): what `tensor`'s values live in (its storage: one object
    for every tensor viewing it, while it lives), a function giving those bytes (uint8, on the
    CPU), and where `tensor` sits in them (dtype, device, shape, stride, offset). Refused
    (ValueError): a layout other than strided, a quantized tensor, a conjugate or negative view."""
    torch = import_torch()
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_conj() or tensor.is_neg():
        raise ValueError(f"a {tensor.layout} {tensor.dtype} tensor is not spilled as bytes")
    storage = tensor.untyped_storage()

    def data() -> np.ndarray:
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).cpu().numpy()
    return storage, data, (tensor.dtype, tensor.device, tuple(tensor.shape), tuple(tensor.stride()),
                           tensor.storage_offset())


def values_from(data: np.ndarray, where: tuple):
    """values_of's bytes (`data`, uint8, writable: the CPU values are made on it) as values again, on
    the device `where` names: a uint8 tensor holding them."""
    torch = import_torch()
    values = torch.from_numpy(data) if data.size else torch.empty(0, dtype=torch.uint8)
    return values if values.device == where[1] else values.to(where[1])


def tensor_in(values, where: tuple):
    """The tensor at `where` (values_of's) in `values` (values_from's): a view of them, so that
    tensors that viewed one storage view one again."""
    torch = import_torch()
    dtype, _, shape, stride, offset = where
    return torch.empty(0, dtype=dtype, device=values.device).set_(values.untyped_storage(), offset, shape, stride)


@contextlib.contextmanager
def in_place_changes(changed):
    """While inside, on this thread: changed(tensor) after each torch function that moved the
    in-place version counter of its first argument or of a tensor given as `out=` (torch's
    in-place methods and operators, `x[i] = v`, `out=` results), as capture.Recorder.stale()
    would find it moved at the end of a pass."""
    torch = import_torch()
    from torch.overrides import TorchFunctionMode

    def version(t) -> int | None:
        try:  # inference tensors keep no version counter
            return t._version
        except RuntimeError:
            return None

    class Watched(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = kwargs.get("out")
            targets = [t for t in (*args[:1], *(out if isinstance(out, (tuple, list)) else (out,)))
                       if isinstance(t, torch.Tensor)]
            before = [version(t) for t in targets]
            result = func(*args, **kwargs)
            for t, v in zip(targets, before):
                if v is not None and version(t) != v:
                    changed(t)
            return result
    with Watched():
        yield


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
