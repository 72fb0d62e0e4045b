"""The torch adapter."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..io.base import TensorInfo
from ..lazy import import_torch


def state_dict_infos(model) -> dict[str, TensorInfo]:
    return {k: TensorInfo(k, dtypes.torch_name(v.dtype), tuple(v.shape)) for k, v in model.state_dict().items()}


def to_numpy(tensor) -> np.ndarray:
    torch = import_torch()
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def set_eval(model) -> None:
    model.eval()


def layers(model) -> list[tuple[str, object]]:
    return list(model.named_modules())
