"""Logical dtypes and their storage.

numpy has no bfloat16, so a bf16 tensor is held as its raw uint16 bits, which
is also how a `.pdparams` file stores it. Every tensor in the engine carries a
logical dtype name beside its numpy array, so that bf16 and uint16 never blur.
"""

from __future__ import annotations

import numpy as np

from .errors import UserError

# logical name -> (numpy storage dtype, safetensors code)
_TABLE = {
    "float64": (np.float64, "F64"),
    "float32": (np.float32, "F32"),
    "float16": (np.float16, "F16"),
    "bfloat16": (np.uint16, "BF16"),
    "int64": (np.int64, "I64"),
    "int32": (np.int32, "I32"),
    "int16": (np.int16, "I16"),
    "int8": (np.int8, "I8"),
    "uint8": (np.uint8, "U8"),
    "bool": (np.bool_, "BOOL"),
}
_FROM_SAFETENSORS = {code: name for name, (_, code) in _TABLE.items()}
FLOATING = ("float64", "float32", "float16", "bfloat16")
_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16",
            "float": "float32", "double": "float64", "fp64": "float64"}


def canonical(name: str) -> str:
    name = _ALIASES.get(name, name)
    if name not in _TABLE:
        raise UserError(f"unknown dtype '{name}'; use one of: {', '.join(_TABLE)}")
    return name


def storage(name: str) -> np.dtype:
    return np.dtype(_TABLE[name][0])


def itemsize(name: str) -> int:
    return storage(name).itemsize


def to_safetensors(name: str) -> str:
    return _TABLE[name][1]


def from_safetensors(code: str) -> str:
    try:
        return _FROM_SAFETENSORS[code]
    except KeyError:
        raise UserError(f"unsupported safetensors dtype '{code}'") from None


def from_numpy(dtype: np.dtype) -> str:
    """Logical dtype of a numpy array as found in a .pdparams file (uint16 means bf16 there)."""
    dtype = np.dtype(dtype)
    if dtype == np.uint16:
        return "bfloat16"
    for name, (np_type, _) in _TABLE.items():
        if name != "bfloat16" and np.dtype(np_type) == dtype:
            return name
    raise UserError(f"unsupported array dtype '{dtype}'")


def torch_name(torch_dtype) -> str:
    name = str(torch_dtype).replace("torch.", "")
    if name not in _TABLE:
        raise UserError(f"unsupported torch dtype '{torch_dtype}'")
    return name


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round to nearest even, keeping NaN a NaN."""
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(np.shape(values))  # 0-d stays 0-d
    bits = values.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)
    return rounded


def cast(array: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Cast the storage array of logical dtype `src` to logical dtype `dst`."""
    if src == dst:
        return array
    if src == "bfloat16":
        array = bf16_to_f32(array)
    if dst == "bfloat16":
        return f32_to_bf16(array.astype(np.float32, copy=False))
    return array.astype(storage(dst))
