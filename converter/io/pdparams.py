"""`.pdparams` without paddle: a pickle (protocol 4) of {name: numpy array}.

Writing streams: the pickler runs in fast mode (no memo) over a dict whose
items are produced lazily, so one tensor at a time is in memory. Reading never
uses plain pickle: a restricted unpickler admits numpy's array reconstruction
and nothing else, so a hostile file cannot import or call anything.
"""

from __future__ import annotations

import collections
import io
import pickle

import numpy as np

from .. import dtypes
from ..errors import UserError
from .base import Source, TensorInfo

_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]


class _LazyDict:
    def __init__(self, items):
        self.items = items


class _Payload:
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


class _StreamingPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, _LazyDict):
            return dict, (), None, None, obj.items
        if isinstance(obj, _Payload):
            a = obj.array
            # the same reduction numpy uses, built from C-order bytes in one copy
            return _RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, a.shape, a.dtype, False, a.tobytes())
        return NotImplemented


def write_pdparams(file, infos: list[TensorInfo], produce, progress=None) -> None:
    def items():
        for info in infos:
            array = produce(info)
            yield info.name, _Payload(array)
            if progress is not None:
                progress(info.nbytes)

    pickler = _StreamingPickler(file, protocol=4)
    pickler.fast = True
    pickler.dump(_LazyDict(items()))


# (module, name) pairs that numpy arrays and dtypes pickle through, across numpy 1.x and 2.x
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("collections", "OrderedDict"),
}


def _empty_dict():
    """The streaming writer opens its top-level dict as dict(); nothing else may be called."""
    return {}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("builtins", "dict"):
            return _empty_dict
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


def scan_pdparams(path: str, on_array) -> list[str]:
    """Stream through a .pdparams file, calling `on_array(index, array)` for each array
    in file order and dropping it afterwards; returns the keys in file order."""
    counter = iter(range(1 << 62))

    class _Stub:
        __slots__ = ("index",)

        def __setstate__(self, state):
            _, shape, dtype, fortran, data = state
            self.index = next(counter)
            array = np.frombuffer(data, dtype=dtype)
            array = array.reshape(shape, order="F" if fortran else "C")
            on_array(self.index, array)

    class _ScanUnpickler(_RestrictedUnpickler):
        def find_class(self, module, name):
            if name == "_reconstruct" and (module, name) in _ALLOWED:
                return lambda cls, shape, dtype_code: _Stub()
            return super().find_class(module, name)

    try:
        with open(path, "rb") as f:
            obj = _ScanUnpickler(io.BufferedReader(f, 1 << 20)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise UserError(f"'{path}' cannot be read back as .pdparams: {exc}") from None
    if not isinstance(obj, dict) or not all(isinstance(v, _Stub) for v in obj.values()):
        raise UserError(f"'{path}' does not hold a dict of arrays")
    return [name for name, _ in sorted(obj.items(), key=lambda kv: kv[1].index)]
