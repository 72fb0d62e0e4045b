"""The paddle adapter."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..io.base import TensorInfo
from ..lazy import import_paddle


def _dtype_name(dtype) -> str:
    return str(dtype).replace("paddle.", "")


def state_dict_infos(model) -> dict[str, TensorInfo]:
    return {k: TensorInfo(k, _dtype_name(v.dtype), tuple(v.shape)) for k, v in model.state_dict().items()}


def to_numpy(tensor) -> np.ndarray:
    paddle = import_paddle()
    if tensor.dtype == paddle.bfloat16:
        return tensor.cast("float32").numpy()
    return tensor.numpy()


def read_weights(path: str) -> dict[str, np.ndarray]:
    """A converted file's arrays, read without plain pickle."""
    if path.lower().endswith(".safetensors"):
        from ..io.safetensors_io import SafetensorsSource
        with SafetensorsSource(path) as s:
            return {name: s.read(name) for name in s.infos}
    from ..io.pdparams import load_pdparams
    return load_pdparams(path)


def load_into(model, path: str) -> tuple[list[str], list[str]]:
    """Load a converted file into the paddle model; (missing keys, unexpected keys)."""
    import_paddle()
    weights = read_weights(path)
    expected = model.state_dict()
    missing = sorted(k for k in expected if k not in weights)
    unexpected = sorted(k for k in weights if k not in expected)
    model.set_state_dict({k: v for k, v in weights.items() if k in expected})
    return missing, unexpected


def set_eval(model) -> None:
    model.eval()


def layers(model) -> list[tuple[str, object]]:
    return [("", model)] + list(model.named_sublayers())


def logical_dtype(tensor) -> str:
    return dtypes.canonical(_dtype_name(tensor.dtype))
