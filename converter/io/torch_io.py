"""torch checkpoints (.pt, .pth, .bin) through torch.load(weights_only=True, mmap=True).

weights_only stays on: a checkpoint never runs pickled code. Wrapped
checkpoints ({"state_dict": ...}, {"model": ...}) are unwrapped with a note."""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile

import numpy as np

from .. import dtypes
from ..errors import UserError, quoted
from ..lazy import import_torch
from . import unpickle
from .stable import StableFile
from .base import MAX_DIMS, Source, TensorInfo, check_repeats, looks_like_text, valid_bools

WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of torch's format before 1.6


def not_a_checkpoint(path: str, head: bytes) -> str | None:
    """Why a file that should be a torch checkpoint is not one, judged from its first bytes
    (text, an HTML page, a Git LFS pointer), or None when it may be one (a zip or a pickle)."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or head.startswith(b"\x80"):
        return None
    what = looks_like_text(head) or "neither a zip archive nor a pickle; pass a file written by torch.save"
    return f"{quoted(path)} is not a torch checkpoint: it is {what}"


def _scan_legacy(path: str) -> None:
    """A pre-1.6 torch file (pickles one after another, then raw storages) is checked with the
    data-only unpickler before torch.load sees it: no hash bombs, depth or memo bombs. The file
    is read, not mapped (a map of a file that shrinks meanwhile dies of SIGBUS): torch.load holds
    such a file whole in memory afterwards anyway."""
    with open(path, "rb") as f:
        data = f.read()
    position = 0
    foreign: list[str] = []
    try:
        for index in range(5):  # magic, protocol, system info, the state, the storage keys
            obj, position = unpickle.load(data, lambda m, n: None, lambda pid: unpickle.Opaque("storage"),
                                          foreign, position)
            if index == 0 and obj != LEGACY_MAGIC:
                if foreign:
                    raise UserError(_refusal(path, foreign[0]))
                raise UserError(f"{quoted(path)} is not a torch checkpoint: it is a plain pickle of a "
                                f"{type(obj).__name__}, not a file written by torch.save")
    except unpickle.Refused as exc:
        raise UserError(f"{quoted(path)} is not a readable torch checkpoint: {exc}; re-save it or re-download it") from None


def _refusal(path: str, culprit: str) -> str:
    return (f"refusing to load {quoted(path)}: its pickle asks to import or call code that is not tensor data"
            f" ({culprit[:160]}); only plain state dicts are accepted. "
            "If you trust it, re-save it as a state dict or safetensors")


def _mappable(path: str) -> bool:
    """torch.load(mmap=True) reads a deflated member's compressed bytes as the tensor's data; and a
    big-endian file's storages are swapped in torch's private map, which the file's own bytes
    (read where the storages lie, and what dropping the map's pages gives back) are not."""
    try:
        with zipfile.ZipFile(path) as archive:
            orders = [archive.read(i)[:16] for i in archive.infolist() if i.filename.endswith("/byteorder")]
            return (all(i.compress_type == zipfile.ZIP_STORED for i in archive.infolist())
                    and all(o.strip() in (b"little", b"") for o in orders))
    except Exception:  # a zip Python cannot read: torch.load without mmap gives the verdict
        return False


def _load(path: str):
    """(state, memory-mapped?)"""
    with open(path, "rb") as f:
        zipped = f.read(4).startswith(b"PK")
    with warnings.catch_warnings():  # torch's notes on pickle protocols are not the user's concern
        warnings.simplefilter("ignore")
        torch = import_torch()
        if not zipped:
            _scan_legacy(path)
        mapped = zipped and _mappable(path)
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mapped), mapped
        except pickle.UnpicklingError as exc:
            text = str(exc)
            culprit = next((line.strip().rstrip(".") for line in text.splitlines()
                            if "GLOBAL" in line or "unsupported" in line.lower()), "")
            if "Weights only load failed" in text or culprit:
                raise UserError(_refusal(path, culprit or "a name outside torch's allow-list")) from None
            raise _unreadable(path, exc) from None
        except Exception as exc:  # whatever torch raises on a damaged file, it is the file's fault
            raise _unreadable(path, exc) from None


def _unreadable(path: str, exc: Exception) -> UserError:
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:160] or type(exc).__name__
    return UserError(f"{quoted(path)} is not a readable torch checkpoint ({first}); "
                     "it is truncated or corrupt: re-download or re-save it")


def _text_keys(obj: dict, path: str) -> dict:
    """The state dict with its keys as text; two keys that read the same (1 and '1') are an error."""
    out, original = {}, {}
    for key, value in obj.items():
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise UserError(f"{quoted(path)} has a key that is a {type(key).__name__}, not a string; "
                            "pass a state dict keyed by parameter names")
        text = str(key)
        if text in out:
            raise UserError(f"{quoted(path)} has two keys that read {quoted(text)}: "
                            f"{_spell(original[text])} and {_spell(key)}; rename one and re-save")
        out[text], original[text] = value, key
    return out


def _spell(key) -> str:
    return quoted(key) + " (a string)" if isinstance(key, str) else f"{key!r} (an integer)"


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
        raise UserError(f"{quoted(path)} holds a {type(obj).__name__}, not a state dict; "
                        "save model.state_dict() instead of the model")
    obj = _text_keys(obj, path)
    bad = sorted(k for k, v in obj.items() if not is_tensor(v))
    if bad:
        raise UserError(f"{quoted(path)} has entries that are not tensors: {', '.join(quoted(k) for k in bad[:8])}; "
                        "pass a checkpoint that is a state dict, or one wrapped under 'state_dict' or 'model'")
    return obj


def tensor_kind_problem(t) -> str | None:
    """What kind of tensor `t` is when it is not one whose bytes can be read (nested, meta-device,
    sparse, quantized), with what to do, or None for a dense tensor."""
    torch = import_torch()
    if t.is_nested:
        return "a nested tensor (tensors of different shapes in one); save each of them as a tensor of its own"
    if t.device.type == "meta":
        return ("on the meta device: it has a shape but no data (saved before the weights were loaded or "
                "materialised); save the model after loading its weights")
    if t.layout != torch.strided:
        return f"sparse ({t.layout}), not a dense tensor; save it with .to_dense()"
    if t.is_quantized:
        return f"quantized ({t.dtype}); save it with .dequantize()"
    return None


def _check_tensor(path: str, name: str, t) -> None:
    """A tensor torch.load made must be a dense tensor with data in memory, and fit in its storage:
    no view larger than the bytes behind it."""
    kind = tensor_kind_problem(t)
    if kind:
        raise UserError(f"{quoted(path)}: tensor {quoted(name)} is {kind}")
    if t.dim() > MAX_DIMS:
        raise UserError(f"{quoted(path)}: tensor {quoted(name)} has {t.dim()} dimensions (at most {MAX_DIMS})")
    if any(s < 0 for s in t.stride()):
        raise UserError(f"{quoted(path)}: tensor {quoted(name)} {list(t.shape)} has a negative stride "
                        f"{list(t.stride())}; re-save it with .contiguous()")


class TorchSource(Source):
    """A checkpoint torch.load reads. When torch maps the file, each tensor's bytes are read with
    pread from where its storage lies in the zip (see stable.py: a read of torch's map after the
    file shrank dies of SIGBUS); the map serves only where a storage's place cannot be told."""

    def __init__(self, path: str):
        super().__init__(path)
        torch = import_torch()
        self._file = StableFile(path)
        try:
            obj, self._mapped = _load(path)
            obj = unwrap_state(obj, lambda v: isinstance(v, torch.Tensor), path, self.notes)
            self._tensors = obj
            for name, t in obj.items():
                _check_tensor(path, name, t)
                self.infos[name] = TensorInfo(name, dtypes.torch_name(t.dtype), tuple(t.shape))
            # views that repeat elements (expanded ones) are read as torch reads them
            check_repeats(path, ((t.numel(), t.untyped_storage().nbytes() // max(t.element_size(), 1), t.element_size())
                                 for t in obj.values()))
            self._places = _storage_places(self._file, obj.values()) if self._mapped else {}
        except BaseException:
            self._file.close()
            raise

    def read(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        storage = t.untyped_storage()
        place = self._places.get(storage.data_ptr())
        if place is None:
            return valid_bools(self.path, name, tensor_to_numpy(t))
        dtype = dtypes.storage(self.infos[name].dtype)
        raw = self._file.array(place, place, np.dtype(np.uint8), storage.nbytes())
        flat = raw.view(dtype)
        strides = tuple(s * dtype.itemsize if d > 1 else 0 for d, s in zip(t.shape, t.stride()))
        view = np.lib.stride_tricks.as_strided(flat[t.storage_offset():], shape=tuple(t.shape), strides=strides,
                                               writeable=False)
        return valid_bools(self.path, name, view)

    def byte_range(self, name: str):
        t = self._tensors[name]
        place = self._places.get(t.untyped_storage().data_ptr())
        if place is None or not t.is_contiguous():
            return None
        return self._file, place + t.storage_offset() * t.element_size(), t.numel() * t.element_size()

    def reference(self, name: str) -> np.ndarray:
        """The tensor as torch.load decoded it (byte order, view), not as `read` takes its bytes."""
        return tensor_to_numpy(self._tensors[name])

    def release(self, name: str) -> None:
        """Drop the tensor's file pages from this process's memory (they stay in the page cache)."""
        if self._mapped and self._tensors[name].untyped_storage().data_ptr() not in self._places:
            storage = self._tensors[name].untyped_storage()
            _drop_pages(storage.data_ptr(), storage.nbytes())

    def close(self) -> None:
        self._tensors = {}
        self._file.close()


def _storage_places(file: StableFile, tensors) -> dict[int, int]:
    """{storage address: its offset in the file} for the storages of a checkpoint torch.load mapped:
    torch maps the whole file and each storage is its stored zip member's bytes, so one base
    address must put every storage exactly at a member of its size. Empty when none does."""
    from .torch_zip import _member_data_offset
    storages = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes():
            storages[storage.data_ptr()] = storage.nbytes()
    if not storages:
        return {}
    try:
        with zipfile.ZipFile(os.fdopen(os.dup(file.fd), "rb")) as archive:
            members = {}
            for info in archive.infolist():
                if info.compress_type == zipfile.ZIP_STORED and "/data/" in info.filename:
                    start = _member_data_offset(file.fd, info, file.size)
                    if start is not None:
                        members[start] = info.file_size
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return {}
    first, size = next(iter(storages.items()))
    for start, length in members.items():
        base = first - start
        if length == size and all(members.get(address - base) == n for address, n in storages.items()):
            return {address: address - base for address in storages}
    return {}


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
    """A storage array of logical dtype `dtype` as a torch tensor of its own (bf16 from its uint16
    bits)."""
    return numpy_view(np.array(array), dtype)  # writable and owned


def numpy_view(array: np.ndarray, dtype: str):
    """A torch tensor viewing storage array `array` of logical dtype `dtype` (bf16 from its uint16
    bits), without a copy; a read-only array is viewed too, for reading only (torch warns that it
    cannot mark the tensor so)."""
    torch = import_torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
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
            kind = tensor_kind_problem(t)
            if kind:
                raise UserError(f"the torch model's tensor {quoted(name)} is {kind}")
            self.infos[name] = TensorInfo(name, dtypes.torch_name(t.dtype), tuple(t.shape))

    def read(self, name: str) -> np.ndarray:
        return tensor_to_numpy(self._tensors[name])
