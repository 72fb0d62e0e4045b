"""torch checkpoints (.pt, .pth, .bin) through torch.load(weights_only=True, mmap=True).

weights_only stays on: a checkpoint never runs pickled code. Wrapped
checkpoints ({"state_dict": ...}, {"model": ...}) are unwrapped with a note."""

from __future__ import annotations

import pickle
import warnings
import zipfile

import numpy as np

from .. import dtypes
from ..errors import UserError
from ..lazy import import_torch
from .base import Source, TensorInfo

WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")


def _load(path: str):
    """(state, memory-mapped?)"""
    with warnings.catch_warnings():  # torch's notes on pickle protocols are not the user's concern
        warnings.simplefilter("ignore")
        return _load_loud(path)


def _load_loud(path: str):
    torch = import_torch()
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True), True
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            # files from before torch's zip format cannot be memory-mapped
            return torch.load(path, map_location="cpu", weights_only=True), False
    except pickle.UnpicklingError as exc:
        text = str(exc)
        culprit = ""
        for line in text.splitlines():
            if "GLOBAL" in line or "Unsupported global" in line or "unsupported" in line.lower():
                culprit = line.strip().rstrip(".")
                break
        if "Weights only load failed" in text or culprit:
            raise UserError(
                f"refusing to load '{path}': its pickle asks to import or call code that is not tensor data"
                f"{' (' + culprit[:160] + ')' if culprit else ''}; only plain state dicts are accepted. "
                "If you trust it, re-save it as a state dict or safetensors") from None
        raise UserError(f"'{path}' is not a readable torch checkpoint ({text.splitlines()[0][:160]}); "
                        "it is truncated or corrupt: re-download or re-save it") from None
    except (zipfile.BadZipFile, EOFError, RuntimeError, ValueError, OSError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise UserError(f"'{path}' is not a readable torch checkpoint ({first}); "
                        "it is truncated or corrupt: re-download or re-save it") from None


def unwrap_state(obj, is_tensor, path: str, notes: list) -> dict:
    """The state dict inside a checkpoint: {"state_dict": ...} and the like unwrapped (noted)."""
    for _ in range(3):
        if isinstance(obj, dict) and not any(is_tensor(v) for v in obj.values()):
            key = next((k for k in WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
            if key is None:
                break
            others = sorted(str(k) for k in obj if k != key)
            notes.append(f"unwrapped the '{key}' entry" + (f" (ignored: {', '.join(others)})" if others else ""))
            obj = obj[key]
    if not isinstance(obj, dict):
        raise UserError(f"'{path}' holds a {type(obj).__name__}, not a state dict; "
                        "save model.state_dict() instead of the model")
    bad = sorted(str(k) for k, v in obj.items() if not is_tensor(v))
    if bad:
        raise UserError(f"'{path}' has entries that are not tensors: {', '.join(bad[:8])}; "
                        "pass a checkpoint that is a state dict, or one wrapped under 'state_dict' or 'model'")
    return obj


class TorchSource(Source):
    def __init__(self, path: str):
        super().__init__(path)
        torch = import_torch()
        obj, self._mapped = _load(path)
        obj = unwrap_state(obj, lambda v: isinstance(v, torch.Tensor), path, self.notes)
        self._tensors = obj
        for name, t in obj.items():
            self.infos[name] = TensorInfo(name, dtypes.torch_name(t.dtype), tuple(t.shape))

    def read(self, name: str) -> np.ndarray:
        return tensor_to_numpy(self._tensors[name])

    def release(self, name: str) -> None:
        """Drop the tensor's file pages from this process's memory (they stay in the page cache)."""
        if self._mapped:
            storage = self._tensors[name].untyped_storage()
            _drop_pages(storage.data_ptr(), storage.nbytes())

    def close(self) -> None:
        self._tensors = {}


def _drop_pages(address: int, length: int) -> None:
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    start = address - address % page
    end = address + length
    end += -end % page
    if length <= 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


def numpy_to_tensor(array: np.ndarray, dtype: str):
    """A storage array of logical dtype `dtype` as a torch tensor (bf16 from its uint16 bits)."""
    torch = import_torch()
    array = np.array(array)  # writable and owned
    if dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def tensor_to_numpy(t) -> np.ndarray:
    """A torch tensor's storage array (bf16 as uint16 bits), sharing memory where it can."""
    torch = import_torch()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class StateDictSource(Source):
    """A live torch model's state dict as a source, for converting in memory."""

    def __init__(self, state_dict, label: str = "<torch model>"):
        super().__init__(label)
        self._tensors = state_dict
        for name, t in state_dict.items():
            self.infos[name] = TensorInfo(name, dtypes.torch_name(t.dtype), tuple(t.shape))

    def read(self, name: str) -> np.ndarray:
        return tensor_to_numpy(self._tensors[name])
