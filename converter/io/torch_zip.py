"""torch's zip checkpoints read without torch.

A `torch.save` file is a zip: `<name>/data.pkl` (the structure, a pickle whose tensors
point at storages by persistent id) and `<name>/data/<key>` (each storage's raw bytes,
stored uncompressed). The pickle is read by an unpickler that knows only the handful of
names a state dict uses (the tensor and parameter rebuild functions, the typed storage
classes, OrderedDict) and maps each to a harmless stand-in: nothing is imported and no
pickled code runs. Tensors become views of the memory-mapped file.

Anything else (an unknown name, a compressed member, a non-zip file) raises
`NotPlain`, and the caller falls back to torch.load(weights_only=True), which
judges it with torch's own allow-list.
"""

from __future__ import annotations

import collections
import io
import mmap
import pickle
import struct
import zipfile

import numpy as np

from .. import dtypes
from .base import Source, TensorInfo

STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
    "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
}


class NotPlain(Exception):
    """Not a plain zip state dict that this reader handles; torch.load decides."""


class _StorageType:
    def __init__(self, dtype: str):
        self.dtype = dtype


class _Storage:
    def __init__(self, dtype: str, key: str, numel: int):
        self.dtype, self.key, self.numel = dtype, key, numel


class _Tensor:
    def __init__(self, storage: _Storage, offset: int, shape, stride):
        if not isinstance(storage, _Storage):
            raise NotPlain("a tensor without a storage")
        self.storage, self.offset = storage, int(offset)
        self.shape, self.stride = tuple(int(d) for d in shape), tuple(int(d) for d in stride)
        last = self.offset + sum((d - 1) * st for d, st in zip(self.shape, self.stride) if d > 0)
        if any(d == 0 for d in self.shape):
            last = self.offset - 1
        if self.offset < 0 or last >= storage.numel:
            raise NotPlain("a tensor reaches past its storage")


def _rebuild_tensor(storage, offset, shape, stride, *rest):
    return _Tensor(storage, offset, shape, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *rest):
    return data


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(STORAGE_DTYPES[name])
        raise NotPlain(f"{module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise NotPlain("an unknown persistent id")
        return _Storage(pid[1].dtype, str(pid[2]), int(pid[4]))


def _data_offset(raw: mmap.mmap, info: zipfile.ZipInfo) -> int:
    header = raw[info.header_offset:info.header_offset + 30]
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise NotPlain("a damaged zip member")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


class TorchZipSource(Source):
    def __init__(self, path: str, unwrap):
        super().__init__(path)
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError):
            raise NotPlain("not a zip file") from None
        with archive:
            members = {i.filename: i for i in archive.infolist()}
            pkl = [n for n in members if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pkl) != 1:
                raise NotPlain("no single data.pkl")
            prefix = pkl[0][: -len("data.pkl")]
            byteorder = members.get(prefix + "byteorder")
            if byteorder is not None and archive.read(byteorder).strip() not in (b"little", b""):
                raise NotPlain("a big-endian checkpoint")
            try:
                obj = _Unpickler(io.BytesIO(archive.read(pkl[0]))).load()
            except NotPlain:
                raise
            except Exception as exc:  # damaged structure: torch.load gives the verdict
                raise NotPlain(str(exc)) from None
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._storages = {}
            state = unwrap(obj, lambda v: isinstance(v, _Tensor), path, self.notes)
            for name, t in state.items():
                info = members.get(f"{prefix}data/{t.storage.key}")
                if info is None or info.compress_type != zipfile.ZIP_STORED:
                    raise NotPlain("a missing or compressed storage")
                size = t.storage.numel * dtypes.itemsize(t.storage.dtype)
                if info.file_size != size:
                    raise NotPlain("a storage of the wrong size")
                self._storages[t.storage.key] = (_data_offset(self._map, info), size)
                self.infos[str(name)] = TensorInfo(str(name), t.storage.dtype, t.shape)
            self._tensors = {str(k): v for k, v in state.items()}

    def read(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        start, size = self._storages[t.storage.key]
        if start + size > len(self._map):
            raise NotPlain("a storage past the end of the file")
        dtype = dtypes.storage(t.storage.dtype)
        flat = np.frombuffer(self._map, dtype=dtype, count=t.storage.numel, offset=start)
        return np.lib.stride_tricks.as_strided(flat[t.offset:], shape=t.shape,
                                               strides=tuple(st * dtype.itemsize for st in t.stride),
                                               writeable=False)

    def release(self, name: str) -> None:
        start, size = self._storages[self._tensors[name].storage.key]
        page = start - start % mmap.PAGESIZE
        if size:
            self._map.madvise(mmap.MADV_DONTNEED, page, start + size - page)
