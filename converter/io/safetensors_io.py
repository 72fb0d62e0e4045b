"""safetensors read and write without torch: an 8-byte header length, a JSON
header, then raw row-major data. Tensors are memory-mapped and their pages
released once used, so that only the tensors in hand are resident."""

from __future__ import annotations

import json
import mmap
import os
import struct

import numpy as np

from .. import dtypes
from ..errors import UserError
from ..layout import contiguous
from ..pipeline import ahead
from .base import Source, TensorInfo

_MAX_HEADER = 100 * 1024 * 1024


def _corrupt(path: str, why: str) -> UserError:
    return UserError(f"'{path}' is not a valid safetensors file ({why}); it is truncated or corrupt: re-download or re-export it")


class SafetensorsSource(Source):
    def __init__(self, path: str):
        super().__init__(path)
        size = os.path.getsize(path)
        self._fd = os.open(path, os.O_RDONLY)
        self._map = None
        try:
            self._parse(size)
        except Exception:
            os.close(self._fd)
            raise

    def _parse(self, size: int) -> None:
        head = os.pread(self._fd, 8, 0)
        if len(head) < 8:
            raise _corrupt(self.path, "shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise _corrupt(self.path, f"header length {n} does not fit in a {size}-byte file")
        try:
            header = json.loads(os.pread(self._fd, n, 8).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _corrupt(self.path, f"header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise _corrupt(self.path, "header is not a JSON object")
        data_start = 8 + n
        self._offsets: dict[str, tuple[int, int]] = {}
        entries = []
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = dtypes.from_safetensors(meta["dtype"])
                shape = tuple(int(d) for d in meta["shape"])
                begin, end = (int(x) for x in meta["data_offsets"])
            except UserError:
                raise
            except (KeyError, TypeError, ValueError):
                raise _corrupt(self.path, f"entry '{name}' lacks dtype, shape or data_offsets") from None
            info = TensorInfo(name, dtype, shape)
            if end - begin != info.nbytes or begin < 0:
                raise _corrupt(self.path, f"tensor '{name}' {info.describe()} has {end - begin} bytes of data")
            if data_start + end > size:
                raise _corrupt(self.path, f"tensor '{name}' ends at byte {data_start + end} of a {size}-byte file")
            entries.append((begin, info))
            self._offsets[name] = (data_start + begin, info.nbytes)
        for _, info in sorted(entries, key=lambda e: e[0]):
            self.infos[info.name] = info

    def read(self, name: str) -> np.ndarray:
        """A read-only view of the tensor in the memory-mapped file (no copy)."""
        info = self.infos[name]
        offset, nbytes = self._offsets[name]
        if self._map is None:
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        flat = np.frombuffer(self._map, dtype=dtypes.storage(info.dtype), count=info.numel, offset=offset)
        return flat.reshape(info.shape)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process's memory; they stay in the page cache."""
        if self._map is None or not hasattr(self._map, "madvise"):
            return
        offset, nbytes = self._offsets[name]
        start = offset - offset % mmap.PAGESIZE
        if nbytes:
            self._map.madvise(mmap.MADV_DONTNEED, start, offset + nbytes - start)

    def close(self) -> None:
        self._map = None  # views still held keep the mapping alive until they go
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_safetensors(file, infos: list[TensorInfo], produce, progress=None, on_data=None) -> None:
    """Write tensors in the given order; `produce(info)` returns its storage array."""
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
    for info, array in zip(infos, ahead(lambda i: contiguous(produce(i)), infos, lambda i: i.nbytes)):
        offset = file.tell()
        file.write(memoryview(array.reshape(-1)).cast("B"))
        if on_data is not None:
            on_data(info, offset)
        if progress is not None:
            progress(info.nbytes)
