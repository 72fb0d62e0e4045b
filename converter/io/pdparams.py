"""`.pdparams` without paddle: a pickle (protocol 4) of {name: numpy array}.

Writing streams: the opcodes are written by hand, and each array's data goes
to the file straight from its buffer, so one tensor at a time is in memory. Reading never
uses plain pickle: a restricted unpickler admits numpy's array reconstruction
and nothing else, so a hostile file cannot import or call anything.
"""

from __future__ import annotations

import collections
import io
import mmap
import pickle
import struct

import numpy as np

from .. import dtypes
from ..errors import UserError, quoted
from ..layout import contiguous
from ..pipeline import ahead
from .base import Source, TensorInfo

_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]


def _unicode(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])  # BININT1
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)  # BININT2
    if -(2 ** 31) <= n < 2 ** 31:
        return b"J" + struct.pack("<i", n)  # BININT
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def _tuple(items: list[bytes]) -> bytes:
    if not items:
        return b")"  # EMPTY_TUPLE
    if len(items) <= 3:
        return b"".join(items) + {1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(items)]
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


_DTYPE_CACHE: dict = {}


def _dtype(dtype: np.dtype) -> bytes:
    """The dtype as numpy pickles it, without memo or framing (protocol 2 opcodes)."""
    if dtype not in _DTYPE_CACHE:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=2)
        pickler.fast = True
        pickler.dump(dtype)
        raw = buffer.getvalue()
        assert raw[:2] == b"\x80\x02" and raw[-1:] == b"."
        _DTYPE_CACHE[dtype] = raw[2:-1]
    return _DTYPE_CACHE[dtype]


def _array_header(shape, dtype: np.dtype, nbytes: int) -> bytes:
    """Opcodes that rebuild an ndarray the way numpy's own reduction does, up to its raw data."""
    head = (_unicode(_RECONSTRUCT.__module__) + _unicode(_RECONSTRUCT.__name__) + b"\x93"  # STACK_GLOBAL
            + _unicode("numpy") + _unicode("ndarray") + b"\x93"
            + _tuple([_int(0)]) + b"C\x01b" + b"\x87" + b"R")  # (ndarray, (0,), b'b') REDUCE
    state = b"(" + _int(1) + _tuple([_int(d) for d in shape]) + _dtype(dtype) + b"\x89"  # MARK 1 shape dtype False
    return head + state + b"\x8e" + struct.pack("<Q", nbytes)  # BINBYTES8 length, then the data


# keys paddle.load treats as its own tables, not as tensors
RESERVED = ("StructuredToParameterName@@", "UnpackBigParamInfor@@")


def check_names(infos: list[TensorInfo]) -> None:
    for info in infos:
        if info.name in RESERVED:
            raise UserError(f"output key {quoted(info.name)} is reserved by paddle's .pdparams format "
                            "(paddle.load would not give it back as a tensor); drop or rename it with a rule, "
                            "or write .safetensors")


def write_pdparams(file, infos: list[TensorInfo], produce, progress=None, on_data=None) -> None:
    """A protocol-4 pickle of {name: ndarray}, written opcode by opcode: each array's bytes go
    to the file straight from its buffer, one tensor in memory at a time. paddle.load and
    pickle.load read it as a plain dict of numpy arrays."""
    check_names(infos)
    file.write(b"\x80\x04}")  # PROTO 4, EMPTY_DICT
    for info, array in zip(infos, ahead(lambda i: contiguous(produce(i)), infos, lambda i: i.nbytes)):
        file.write(_unicode(info.name) + _array_header(array.shape, array.dtype, array.nbytes))
        offset = file.tell()
        if array.nbytes:
            file.write(memoryview(array.reshape(-1)).cast("B"))
        if on_data is not None:
            on_data(info, offset)
        file.write(b"tbs")  # TUPLE (the state), BUILD, SETITEM
        if progress is not None:
            progress(info.nbytes)
    file.write(b".")  # STOP


def _releaser(mm, offset: int, length: int):
    """Drop a range's pages from this process (they stay in the page cache; a later touch refaults)."""
    def release():
        start = offset - offset % mmap.PAGESIZE
        if length and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED, start, offset + length - start)
    return release


def scan_written(path: str, infos: list[TensorInfo], on_array) -> list[str]:
    """Read back a file written by write_pdparams for `infos`, memory-mapped: every opcode must
    be the one written for that tensor, and `on_array(index, array, release)` (when given) sees
    each tensor's data in place (no copy; `release()` lets its pages go). Returns the keys
    found; raises UserError where the bytes differ."""
    with open(path, "rb") as f:
        # not closed here: arrays handed to on_array may outlive this call; they keep it alive
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

        def expect(pos: int, raw: bytes, what: str) -> int:
            if mm[pos:pos + len(raw)] != raw:
                raise UserError(f"'{path}' differs from what was written at byte {pos} ({what})")
            return pos + len(raw)

        pos = expect(0, b"\x80\x04}", "pickle header")
        names = []
        for index, info in enumerate(infos):
            dtype = dtypes.storage(info.dtype)
            pos = expect(pos, _unicode(info.name) + _array_header(info.shape, dtype, info.nbytes), f"'{info.name}'")
            if on_array is not None:
                on_array(index, np.frombuffer(mm, dtype=dtype, count=info.numel, offset=pos).reshape(info.shape),
                         _releaser(mm, pos, info.nbytes))
            pos = expect(pos + info.nbytes, b"tbs", f"end of '{info.name}'")
            names.append(info.name)
        expect(pos, b".", "end of file")
        if pos + 1 != len(mm):
            raise UserError(f"'{path}' has {len(mm) - pos - 1} bytes after its end")
    return names


# (module, name) pairs that numpy arrays and dtypes pickle through, across numpy 1.x and 2.x
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("collections", "OrderedDict"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it asks to import {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it uses persistent ids, which a .pdparams file never has")


def load_pdparams(path: str) -> dict[str, np.ndarray]:
    """Every array in the file, read through the restricted unpickler."""
    try:
        with open(path, "rb") as f:
            obj = _RestrictedUnpickler(io.BufferedReader(f, 1 << 20)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise UserError(f"refusing to read '{path}' as .pdparams: {exc}; "
                        "only files holding plain numpy arrays are accepted") from None
    if not isinstance(obj, dict):
        raise UserError(f"'{path}' does not hold a dict of arrays; it is not a .pdparams state dict")
    out = collections.OrderedDict()
    for name, value in obj.items():
        if name == "StructuredToParameterName@@":
            continue
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise UserError(f"'{path}' entry {name!r} is not a numpy array; it is not a .pdparams state dict")
        out[name] = value
    return out


class PdparamsSource(Source):
    """A .pdparams file as a source (loaded whole; pickles cannot be read in parts)."""

    def __init__(self, path: str):
        super().__init__(path)
        self._arrays = load_pdparams(path)
        for name, a in self._arrays.items():
            self.infos[name] = TensorInfo(name, dtypes.from_numpy(a.dtype), tuple(a.shape))

    def read(self, name: str) -> np.ndarray:
        return self._arrays[name]
