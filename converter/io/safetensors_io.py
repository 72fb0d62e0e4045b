"""safetensors read and write without torch: an 8-byte header length, a JSON
header, then raw row-major data. Tensors are read one at a time with pread, so that only
the tensors in hand are resident."""

from __future__ import annotations

import json
import struct

import numpy as np

from .. import dtypes
from ..errors import UserError, one_line, quoted
from .stable import StableFile
from .base import MAX_DIMS, Source, TensorInfo, looks_like_text, shape_problem, valid_bools, write_tensors

_MAX_HEADER = 100 * 1024 * 1024


def _unique_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {quoted(key)} appears twice")
        seen[key] = value
    return seen


def _parse_header(raw: bytes) -> dict:
    """The JSON header, with the safetensors library's verdict on its shape: an object whose keys
    appear once each (the library keeps the last of two; here two is an error)."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise ValueError("__metadata__ is not an object of strings")
    return header


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, meta) -> tuple[TensorInfo, int, int]:
    """(info, begin, end) of one header entry, every field of the right type and range."""
    if not isinstance(meta, dict):
        raise ValueError(f"entry {quoted(name)} is not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str):
        raise ValueError(f"entry {quoted(name)} has no dtype string")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_count(d) for d in shape):
        raise ValueError(f"entry {quoted(name)} has shape {one_line(shape)[:80]}, not a list of at most "
                         f"{MAX_DIMS} non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(x) for x in offsets)
            and offsets[0] <= offsets[1]):
        raise ValueError(f"entry {quoted(name)} has data_offsets {one_line(offsets)[:80]}, not [begin, end]")
    info = TensorInfo(name, dtypes.from_safetensors(dtype), tuple(shape))
    problem = shape_problem(info.shape, dtypes.itemsize(info.dtype))
    if problem:
        raise ValueError(f"entry {quoted(name)} has {problem}")
    if offsets[1] - offsets[0] != info.nbytes:
        raise ValueError(f"tensor {quoted(name)} {info.describe()} has {offsets[1] - offsets[0]} bytes of data")
    return info, offsets[0], offsets[1]


class SafetensorsSource(Source):
    """Tensors are read with pread (see stable.py: a memory map would die of SIGBUS when the file
    shrinks meanwhile), each into memory of its own, shared while it is held."""

    def __init__(self, path: str):
        super().__init__(path)
        self._file = StableFile(path)
        try:
            self._parse(self._file.size)
        except ValueError as exc:
            self._file.close()
            raise UserError(f"{quoted(path)} is not a valid safetensors file ({exc}); it is truncated or corrupt: "
                            "re-download or re-export it") from None
        except Exception:
            self._file.close()
            raise

    def _parse(self, size: int) -> None:
        start = self._file.bytes(0, min(512, size))
        text = looks_like_text(start)
        if text:
            raise UserError(f"{quoted(self.path)} is not a safetensors file: it is {text}")
        if len(start) < 8:
            raise ValueError("shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", start[:8])
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"header length {n} does not fit in a {size}-byte file")
        header = _parse_header(self._file.bytes(8, n))
        data_start = 8 + n
        entries = [_entry(name, meta) for name, meta in header.items() if name != "__metadata__"]
        entries.sort(key=lambda e: (e[1], e[2]))
        end = 0
        for info, begin, stop in entries:  # the data is the tensors back to back, from 0, nothing else
            if begin != end:
                raise ValueError(f"tensor {quoted(info.name)} starts at byte {begin} of the data, "
                                 f"not at {end} where the previous one ends (overlap or gap)")
            end = stop
        if data_start + end != size:
            raise ValueError(f"its tensors end at byte {data_start + end} of a {size}-byte file")
        self._offsets: dict[str, tuple[int, int]] = {}
        for info, begin, _ in entries:
            self.infos[info.name] = info
            self._offsets[info.name] = (data_start + begin, info.nbytes)

    def read(self, name: str) -> np.ndarray:
        """The tensor, read-only, in memory of its own."""
        info = self.infos[name]
        offset, _ = self._offsets[name]
        flat = self._file.array(name, offset, dtypes.storage(info.dtype), info.numel)
        return valid_bools(self.path, name, flat.reshape(info.shape))

    def byte_range(self, name: str):
        offset, nbytes = self._offsets[name]
        return self._file, offset, nbytes


def write_safetensors(file, infos: list[TensorInfo], produce, progress=None, on_data=None, copied=None) -> None:
    """Write tensors in the given order; `produce(info)` returns its storage array (`copied`:
    see base.write_tensors)."""
    header = {"__metadata__": {"format": "np"}}
    offset = 0
    for info in infos:
        header[info.name] = {"dtype": dtypes.to_safetensors(info.dtype), "shape": list(info.shape),
                             "data_offsets": [offset, offset + info.nbytes]}
        offset += info.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    file.write(struct.pack("<Q", len(raw)))
    file.write(raw)
    write_tensors(file, file.tell(), infos, produce, progress=progress, on_data=on_data, copied=copied)
