"""Putting back what a verification changed: framework flags, the paddle device, hooks, train/eval
modes, the torch model's device, and weights changed in place.

Each `record_*` function notes the present state and returns a function that restores it; an
`Undo` runs those last first."""

from __future__ import annotations

from typing import Callable

from .precision import PADDLE_TF32_FLAGS, read_paddle_flags

Restore = Callable[[], None]


class Undo:
    """Restore functions, run last first by `close()`; each runs even when an earlier one fails,
    and the first failure is raised at the end."""

    def __init__(self):
        self._steps: list[Restore] = []

    def push(self, step: Restore) -> None:
        self._steps.append(step)

    def close(self) -> None:
        failure = None
        while self._steps:
            step = self._steps.pop()
            try:
                step()
            except Exception as exc:  # the others still run
                failure = failure or exc
        if failure is not None:
            raise failure


# torch's precision settings, the broad ones before the narrow (setting a broad one sets those under it)
_TORCH_FP32_PRECISION = ("", "cudnn", "mkldnn", "cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul",
                         "mkldnn.conv", "mkldnn.rnn")


def _torch_backend(torch, path: str):
    obj = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
    return obj


def torch_flags() -> dict:
    """Every torch setting that says whether float32 matmuls and convolutions may use TF32."""
    import torch
    flags = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    for path in _TORCH_FP32_PRECISION:
        value = getattr(_torch_backend(torch, path), "fp32_precision", None)
        if value is not None:
            flags[f"{path or 'backends'}.fp32_precision"] = value
    return flags


def record_torch_flags() -> Restore:
    """torch's TF32 settings and its thread count as they are now. The thread count is put back from
    the thread that set the session up: a count set on another thread (the worker beside paddle's
    passes, the analysis pool's threads) becomes, under OpenMP, the count every thread started
    afterwards gets, the user's own ones too."""
    import torch
    before = torch_flags()
    threads = torch.get_num_threads()

    def restore():
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(before["float32_matmul_precision"])
        torch.backends.cuda.matmul.allow_tf32 = before["cuda.matmul.allow_tf32"]
        torch.backends.cudnn.allow_tf32 = before["cudnn.allow_tf32"]
        for path in _TORCH_FP32_PRECISION:  # the newer settings last: they are what the older ones read
            key = f"{path or 'backends'}.fp32_precision"
            if key in before:
                _torch_backend(torch, path).fp32_precision = before[key]

    return restore


def paddle_flags() -> dict:
    """paddle's TF32 flags that this build lets one read, and its current device."""
    import paddle
    return {"device": paddle.get_device(), **read_paddle_flags(PADDLE_TF32_FLAGS)}


def record_paddle_flags() -> Restore:
    import paddle
    before = paddle_flags()

    def restore():
        paddle.set_device(before["device"])
        paddle.set_flags({name: value for name, value in before.items() if name in PADDLE_TF32_FLAGS})

    return restore


def _hook_tables(layer) -> list[dict]:
    """The dicts in which a torch module or paddle layer keeps its hooks."""
    return [value for name, value in vars(layer).items() if "hooks" in name and isinstance(value, dict)]


def record_layers(layers: list) -> Restore:
    """Hooks and train/eval mode of every torch module or paddle layer in `layers`: hooks added
    later are removed, the modes set back."""
    before = [(layer, layer.training, [(table, set(table)) for table in _hook_tables(layer)]) for layer in layers]

    def restore():
        for layer, training, tables in before:
            layer.training = training
            for table, keys in tables:
                for key in [k for k in table if k not in keys]:
                    del table[key]

    return restore


def record_torch_weights(model) -> Restore:
    """A copy of the torch model's parameters and buffers, put back in place."""
    import torch
    saved = {name: t.detach().clone() for name, t in model.state_dict(keep_vars=True).items()}

    def restore():
        with torch.no_grad():
            for name, t in model.state_dict(keep_vars=True).items():
                t.copy_(saved[name].to(t.device))

    return restore


def record_torch_device(model) -> Restore:
    """The device the torch model sits on, when all its tensors share one."""
    devices = {t.device for t in model.state_dict(keep_vars=True).values()}
    if len(devices) != 1:
        return lambda: None
    device = devices.pop()
    return lambda: model.to(device)
