"""`.pdparams` without paddle: a pickle (protocol 4) of {name: numpy array}.

Writing streams: the opcodes are written by hand, and each array's data goes
to the file straight from its buffer, so one tensor at a time is in memory. Reading never
uses plain pickle: the data-only unpickler (unpickle.py) with stand-ins for numpy's array
and dtype reconstruction builds read-only arrays of plain number and bool dtypes over the
memory-mapped file and nothing else, so a hostile file cannot import or call anything, nor
make an object array of pointers. Files paddle.save writes with protocols 2, 3 and 4 are read.
"""

from __future__ import annotations

import collections
import functools
import io
import math
import mmap
import os
import pickle
import struct

import numpy as np

from .. import dtypes
from ..errors import UserError, quoted
from . import unpickle
from .stable import StableFile, changed
from .base import Source, TensorInfo, looks_like_text, shape_problem, valid_bools, write_tensors

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


@functools.cache
def _dtype(dtype: np.dtype) -> bytes:
    """The dtype as numpy pickles it, without memo or framing (protocol 2 opcodes)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=2)
    pickler.fast = True
    pickler.dump(dtype)
    raw = buffer.getvalue()
    assert raw[:2] == b"\x80\x02" and raw[-1:] == b"."
    return raw[2:-1]


def _array_header(shape, dtype: np.dtype, nbytes: int) -> bytes:
    """Opcodes that rebuild an ndarray the way numpy's own reduction does, up to its raw data."""
    head = (_unicode(_RECONSTRUCT.__module__) + _unicode(_RECONSTRUCT.__name__) + b"\x93"  # STACK_GLOBAL
            + _unicode("numpy") + _unicode("ndarray") + b"\x93"
            + _tuple([_int(0)]) + b"C\x01b" + b"\x87" + b"R")  # (ndarray, (0,), b'b') REDUCE
    state = b"(" + _int(1) + _tuple([_int(d) for d in shape]) + _dtype(dtype) + b"\x89"  # MARK 1 shape dtype False
    return head + state + b"\x8e" + struct.pack("<Q", nbytes)  # BINBYTES8 length, then the data


# keys paddle.load treats as its own tables, not as tensors
RESERVED = ("StructuredToParameterName@@", "UnpackBigParamInfor@@")


def write_pdparams(file, infos: list[TensorInfo], produce, progress=None, on_data=None, copied=None) -> None:
    """A protocol-4 pickle of {name: ndarray}, written opcode by opcode: each array's bytes go
    to the file straight from its buffer (or from the source file, `copied`: see
    base.write_tensors), one tensor in memory at a time. paddle.load and pickle.load read it as a
    plain dict of numpy arrays."""
    for info in infos:
        if info.name in RESERVED:
            raise UserError(f"output key {quoted(info.name)} is reserved by paddle's .pdparams format "
                            "(paddle.load would not give it back as a tensor); drop or rename it with a rule, "
                            "or write .safetensors")
    position = file.tell() + file.write(b"\x80\x04}")  # PROTO 4, EMPTY_DICT

    def before(info):
        return _unicode(info.name) + _array_header(info.shape, dtypes.storage(info.dtype), info.nbytes)
    write_tensors(file, position, infos, produce, before, b"tbs", progress, on_data, copied)  # tbs: TUPLE, BUILD, SETITEM
    file.write(b".")  # STOP


def scan_written(path: str, infos: list[TensorInfo]) -> list[str]:
    """Read back the structure of a file written by write_pdparams for `infos`, memory-mapped:
    every opcode must be the one written for that tensor (the tensors' bytes are checked as
    they are written). Returns the keys found; raises UserError where the bytes differ."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:

        def expect(pos: int, raw: bytes, what: str) -> int:
            if mm[pos:pos + len(raw)] != raw:
                raise UserError(f"'{path}' differs from what was written at byte {pos} ({what})")
            return pos + len(raw)

        pos = expect(0, b"\x80\x04}", "pickle header")
        names = []
        for info in infos:
            dtype = dtypes.storage(info.dtype)
            pos = expect(pos, _unicode(info.name) + _array_header(info.shape, dtype, info.nbytes), f"'{info.name}'")
            pos = expect(pos + info.nbytes, b"tbs", f"end of '{info.name}'")
            names.append(info.name)
        expect(pos, b".", "end of file")
        if pos + 1 != len(mm):
            raise UserError(f"'{path}' has {len(mm) - pos - 1} bytes after its end")
    return names


# numpy's array and dtype pickles, protocols 2 to 5, numpy 1.x and 2.x; each name maps to a
# stand-in that builds only what a state dict holds
_PLAIN_DTYPES = {"f8", "f4", "f2", "i8", "i4", "i2", "i1", "u1", "u2", "b1"}


class _Dtype:
    """numpy.dtype(code, align, copy), then its state: a plain number type or nothing."""

    __slots__ = ("code", "dtype")

    def __init__(self, code=None, *rest):
        if not isinstance(code, str) or code not in _PLAIN_DTYPES:
            raise unpickle.Refused(f"an array of dtype {quoted(code)[:40]}; only plain numbers and bools are read "
                                   "(no object, string or structured arrays)")
        self.code, self.dtype = code, np.dtype(code)

    def set_state(self, state) -> None:
        if not (isinstance(state, tuple) and len(state) in (8, 9) and state[0] in (3, 4)):
            raise unpickle.Refused("a dtype state numpy does not write")
        order, subarray, names, fields = state[1:5]
        if subarray is not None or names is not None or fields is not None:
            raise unpickle.Refused("a structured or sub-array dtype")
        if order == ">":
            raise unpickle.Refused("a big-endian array; re-save it on a little-endian machine")
        if order not in ("<", "|", "="):
            raise unpickle.Refused("a dtype with an unknown byte order")


class _Array:
    """numpy's _reconstruct(ndarray, (0,), b'b'), then its state (version, shape, dtype,
    Fortran order, raw bytes): a read-only array over those bytes, never anything else."""

    __slots__ = ("array",)

    def __init__(self, cls=None, *rest):
        if cls is not _NDARRAY:
            raise unpickle.Refused("an array of a class other than numpy.ndarray")
        self.array = None

    def set_state(self, state) -> None:
        if self.array is not None or not (isinstance(state, tuple) and len(state) in (4, 5)):
            raise unpickle.Refused("an array state numpy does not write")
        shape, dtype, fortran, raw = state[-4:]
        if not isinstance(fortran, int):  # numpy reads the flag as an integer: True, 1, 2 all mean Fortran order
            raise unpickle.Refused(f"an array whose Fortran-order flag is a {type(fortran).__name__}")
        self.array = _array_from(raw, dtype, shape, "F" if fortran else "C")


def _array_from(raw, dtype, shape, order: str) -> np.ndarray:
    if not isinstance(dtype, _Dtype):
        raise unpickle.Refused("an array without a plain dtype")
    if not isinstance(shape, tuple) or shape_problem(shape, dtype.dtype.itemsize):
        raise unpickle.Refused(f"an array with shape {quoted(shape)[:60]}")
    if not isinstance(raw, (bytes, memoryview)):
        raise unpickle.Refused("an array whose data is not raw bytes")
    if math.prod(shape) * dtype.dtype.itemsize != len(raw):
        raise unpickle.Refused(f"an array of shape {list(shape)} with {len(raw)} bytes of data")
    return np.frombuffer(raw, dtype=dtype.dtype).reshape(shape, order=order)


def _frombuffer(raw=None, dtype=None, shape=None, order="C", *rest):
    if order not in ("C", "F"):
        raise unpickle.Refused("an array with an unknown memory order")
    holder = _Array(_NDARRAY)
    holder.array = _array_from(raw, dtype, shape, order)
    return holder


def _latin1(text=None, encoding=None, *rest):
    """_codecs.encode(text, 'latin1'): how protocol 2 spells bytes."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise unpickle.Refused("a call of _codecs.encode that is not bytes spelled in latin-1")
    try:
        return text.encode("latin1")
    except UnicodeEncodeError:
        raise unpickle.Refused("bytes spelled with characters outside latin-1") from None


_NDARRAY = object()
_STAND_INS = {("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _Dtype, ("_codecs", "encode"): _latin1,
              ("collections", "OrderedDict"): unpickle.ordered_dict}
for _core in ("numpy.core", "numpy._core"):
    _STAND_INS[(_core + ".multiarray", "_reconstruct")] = _Array
    _STAND_INS[(_core + ".numeric", "_frombuffer")] = _frombuffer


def _refuse(path: str, why: str) -> UserError:
    return UserError(f"refusing to read {quoted(path)} as .pdparams: {why}; only files holding plain numpy "
                     "arrays are accepted")


def _joined_big_arrays(path: str, out: dict, info) -> None:
    """paddle.save with protocol 2 or 3 splits an array of 1 GiB or more into `key@@.N` slices and
    says how in 'UnpackBigParamInfor@@'; join them back (as paddle.load does)."""
    if not isinstance(info, dict):
        raise _refuse(path, "its 'UnpackBigParamInfor@@' is not a table")
    for key, entry in info.items():
        slices = entry.get("slices") if isinstance(entry, dict) else None
        shape = entry.get("OriginShape") if isinstance(entry, dict) else None
        if not (isinstance(slices, list) and slices and all(isinstance(s, str) and s in out for s in slices)
                and len(set(slices)) == len(slices) and isinstance(shape, (tuple, list))
                and not shape_problem(tuple(shape), 1)):
            raise _refuse(path, f"its split array {quoted(key)} does not list its slices and shape")
        parts = [out.pop(s) for s in slices]
        if len({p.dtype for p in parts}) != 1 or any(p.ndim != 1 for p in parts):
            raise _refuse(path, f"the slices of {quoted(key)} differ in dtype or are not flat")
        joined = np.concatenate(parts)
        if joined.size != math.prod(shape):
            raise _refuse(path, f"the slices of {quoted(key)} do not fill its shape {list(shape)}")
        out[key] = joined.reshape(shape)


def _mapped(fd: int):
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file
        return b""


def load_pdparams(path: str) -> dict[str, np.ndarray]:
    """Every array in the file, read through the data-only unpickler: read-only views of the
    memory-mapped file, of plain number and bool dtypes only. paddle's own tables
    ('StructuredToParameterName@@') are left out; arrays paddle split are joined."""
    with open(path, "rb") as f:
        data = _mapped(f.fileno())
    return _arrays_in(path, data)


def _arrays_in(path: str, data) -> dict[str, np.ndarray]:
    text = looks_like_text(bytes(data[:512]))
    if text:
        raise UserError(f"{quoted(path)} is not a .pdparams file: it is {text}")
    try:
        obj, end = unpickle.load(data, lambda module, name: _STAND_INS.get((module, name)))
    except unpickle.Refused as exc:
        raise _refuse(path, str(exc)) from None
    if not isinstance(obj, dict):
        raise UserError(f"{quoted(path)} does not hold a dict of arrays; it is not a .pdparams state dict")
    out = collections.OrderedDict()
    for name, value in obj.items():
        if name in RESERVED:
            continue
        if not isinstance(name, str) or not isinstance(value, _Array) or value.array is None:
            raise UserError(f"{quoted(path)} entry {quoted(name)} is not a numpy array; it is not a .pdparams state dict")
        out[name] = valid_bools(path, name, value.array)
    if "UnpackBigParamInfor@@" in obj:
        _joined_big_arrays(path, out, obj["UnpackBigParamInfor@@"])
    return out


class PdparamsSource(Source):
    """A .pdparams file as a source. The pickle is read whole from a memory map (it cannot be read
    in parts), after the file's size is checked; each array's place in the file is kept and its
    data read with pread when asked for (see stable.py: a map read after the file shrank dies of
    SIGBUS). Arrays paddle split in slices are joined in memory when the file is read."""

    def __init__(self, path: str):
        super().__init__(path)
        self._file = StableFile(path)
        try:
            self._place(path)
        except BaseException:
            self._file.close()
            raise

    def _place(self, path: str) -> None:
        data = _mapped(self._file.fd)
        now = os.fstat(self._file.fd).st_size  # the map's length is the size when it was made
        if len(data) != self._file.size or now != self._file.size:
            raise changed(path, f"is {now} bytes now, {self._file.size} when it was opened")
        arrays = _arrays_in(path, data)
        base = np.frombuffer(data, np.uint8).ctypes.data if len(data) else 0
        self._where: dict[str, tuple] = {}  # name -> (offset, dtype, shape, order)
        self._arrays: dict[str, np.ndarray] = {}  # arrays not in the file as they are (joined slices)
        for name, a in list(arrays.items()):
            self.infos[name] = TensorInfo(name, dtypes.from_numpy(a.dtype), tuple(a.shape))
            offset = a.ctypes.data - base
            if a.nbytes and 0 <= offset and offset + a.nbytes <= len(data) and (a.flags.c_contiguous or a.flags.f_contiguous):
                order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
                self._where[name] = (offset, a.dtype, a.shape, order)
            else:
                self._arrays[name] = np.array(a)  # in memory of its own, not a view of the map
        arrays.clear()  # no view of the map is left: it goes

    def read(self, name: str) -> np.ndarray:
        if name in self._arrays:
            return self._arrays[name]
        offset, dtype, shape, order = self._where[name]
        flat = self._file.array(name, offset, dtype, math.prod(shape))
        return valid_bools(self.path, name, flat.reshape(shape, order=order))

    def byte_range(self, name: str):
        if name not in self._where:
            return None
        offset, dtype, shape, order = self._where[name]
        nbytes = math.prod(shape) * dtype.itemsize
        return (self._file, offset, nbytes) if order == "C" or len(shape) < 2 else None
