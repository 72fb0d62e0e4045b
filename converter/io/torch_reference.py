"""A second decoding of a torch zip checkpoint, for the conversion's self-check.

`TorchZipSource` reads a checkpoint with its own pickle interpreter (unpickle.py), its own table of
storage types, the storages' places in the file found from the zip's local headers and read with
pread, and its own byte-order handling. The self-check must not trust any of that: a defect there
(a big-endian file read as little-endian) would write wrong bytes and pass a check that reads the
source the same way. This module decodes the same file another way, sharing none of those steps:
Python's own C unpickler (with a table of the few names a state dict uses, each a stand-in, so
nothing is imported), zipfile's reading of each member (inflating it where deflated), numpy
dtypes spelled with their byte order from the `byteorder` record, and the view taken with numpy.

It runs only on a file TorchZipSource has accepted, whose pickle has passed every structural
check (memo, depth, key types, tensor geometry), so Python's unpickler never sees a hash bomb.
Each tensor's bytes are read once, from the first to the last element its view reaches, into an
array of their own (swapped where they are not in this machine's order).
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import threading
import zipfile

import numpy as np

from ..errors import UserError, quoted

# the storage classes' element types, as numpy type codes (bfloat16: its 16 bits)
_CODES = {"FloatStorage": "f4", "DoubleStorage": "f8", "HalfStorage": "f2", "BFloat16Storage": "u2",
          "LongStorage": "i8", "IntStorage": "i4", "ShortStorage": "i2", "CharStorage": "i1",
          "ByteStorage": "u1", "BoolStorage": "b1"}


class _StorageClass:
    def __init__(self, code: str):
        self.code = code


class _Tensor:
    __slots__ = ("code", "key", "offset", "shape", "stride")

    def __init__(self, storage, offset, shape, stride, *rest):
        self.code, self.key = storage
        self.offset, self.shape, self.stride = offset, tuple(shape), tuple(stride)


def _contiguous(shape) -> tuple:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def _parameter(data, *rest):
    return data


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _Tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _parameter
        if module == "torch" and name in _CODES:
            return _StorageClass(_CODES[name])
        raise pickle.UnpicklingError(f"{module}.{name} is not state dict data")

    def persistent_load(self, pid):
        kind, cls, key = pid[0], pid[1], pid[2]
        if kind != "storage" or not isinstance(cls, _StorageClass):
            raise pickle.UnpicklingError("a persistent id that is not a storage")
        return cls.code, str(key)


class TorchZipReference:
    """Each tensor of a torch zip checkpoint (by the name TorchZipSource gives it), decoded as
    described above: a C-ordered array in this machine's byte order (bfloat16 as uint16 bits)."""

    def __init__(self, fd: int, path: str, unwrap):
        self.path = path
        self._lock = threading.Lock()
        self._zip = zipfile.ZipFile(os.fdopen(os.dup(fd), "rb"))
        try:
            names = [n for n in self._zip.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            self._prefix = names[0][: -len("data.pkl")]
            order = b"little"
            if self._prefix + "byteorder" in self._zip.namelist():
                order = self._zip.read(self._prefix + "byteorder").strip() or b"little"
            self._order = {b"little": "<", b"big": ">"}[order]
            obj = _Unpickler(io.BytesIO(self._zip.read(names[0]))).load()
            self._tensors = unwrap(obj, lambda v: isinstance(v, _Tensor), path, [])
        except BaseException:
            self._zip.close()
            raise

    def read(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        dtype = np.dtype(self._order + t.code if t.code not in ("i1", "u1", "b1") else t.code)
        if 0 in t.shape:
            return np.empty(t.shape, dtype=dtype.newbyteorder("="))
        span = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride))
        flat = self._elements(t, dtype, span)
        if flat.size != span:
            raise UserError(f"{quoted(self.path)}: storage {quoted(t.key)} ends before tensor {quoted(name)} "
                            "does; the file is corrupt: re-save or re-download it")
        native = dtype.newbyteorder("=")
        if span == int(np.prod(t.shape)) and t.stride == _contiguous(t.shape):
            return flat.reshape(t.shape) if dtype == native else flat.reshape(t.shape).astype(native)
        strides = tuple(s * dtype.itemsize for s in t.stride)
        view = np.lib.stride_tricks.as_strided(flat, shape=t.shape, strides=strides, writeable=False)
        return np.array(view, dtype=native, order="C")

    def _elements(self, t: _Tensor, dtype: np.dtype, span: int) -> np.ndarray:
        """`span` elements of the tensor's storage from its offset: a stored member read at the
        place zipfile's own parsing of its local header gives (zipfile would compute the CRC of
        every byte read: the reader has checked it), a deflated one inflated by zipfile."""
        start = t.offset * dtype.itemsize
        with self._lock, self._zip.open(self._prefix + "data/" + t.key) as member:
            at = getattr(member, "_orig_compress_start", None)
            if self._zip.getinfo(self._prefix + "data/" + t.key).compress_type != zipfile.ZIP_STORED or at is None:
                member.seek(start)
                return np.frombuffer(member.read(span * dtype.itemsize), dtype=dtype)
            at += start
            size = min(span * dtype.itemsize, max(member._orig_file_size - start, 0))
        out = np.empty(size // dtype.itemsize, dtype=dtype)
        raw, done = memoryview(out).cast("B"), 0
        while done < len(raw):
            n = os.preadv(self._zip.fp.fileno(), [raw[done:]], at + done)
            if n <= 0:
                return out[:done // dtype.itemsize]
            done += n
        return out

    def close(self) -> None:
        self._zip.close()
