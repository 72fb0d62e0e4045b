"""What every checkpoint source provides."""

from __future__ import annotations

import math

import os
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..layout import c_order_blocks


MAX_DIMS = 64
MAX_BYTES = 1 << 62  # what numpy and torch can address; a shape past it is not a real tensor
MAX_REPEATED = 1 << 30  # bytes a checkpoint's views may show beyond the elements they read (expanded views)


def repeated_bytes(views) -> int:
    """The bytes that views of (numel, storage numel, item size) show beyond what their storages
    hold: 0 for views that repeat no element. An expanded view (x.expand(4, 3) saved as it is)
    is valid torch storage and is written out as the values it shows, but a 4-byte storage viewed
    as 2**31 elements would ask for 8 GB of output: the total is bounded by MAX_REPEATED."""
    return sum(max(numel - held, 0) * itemsize for numel, held, itemsize in views)


def shape_problem(shape, itemsize: int) -> str | None:
    """Why `shape` cannot be a tensor's shape, or None: at most 64 non-negative integers whose
    extent, zero-sized dimensions aside, stays addressable (numpy refuses (2**62, 0) too)."""
    if len(shape) > MAX_DIMS:
        return f"{len(shape)} dimensions (at most {MAX_DIMS})"
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape):
        return f"shape {list(shape)} holds a negative or non-integer size"
    extent = itemsize
    for d in shape:
        extent *= max(d, 1)
    if extent >= MAX_BYTES:
        return f"shape {list(shape)} is larger than any tensor can be"
    return None


def looks_like_text(head: bytes) -> str | None:
    """What a weights file's first bytes say it is when it is text: a Git LFS pointer, an HTML
    page (a failed download), other text; None when it may be binary."""
    text = head.lstrip().lower()
    if text.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer (a small text file standing for the real one); run `git lfs pull` to fetch it"
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml")):
        return "an HTML page (a failed or redirected download?); download the real file again"
    if head and all(32 <= b < 127 or b in b"\t\r\n" for b in head[:256]):
        return "a text file; pass the weights file itself"
    return None


def valid_bools(path: str, name: str, array: np.ndarray) -> np.ndarray:
    """A bool tensor's bytes must be 0 or 1: any other byte is no value at all (torch and numpy
    read it as True but copy it on as it is), so it is an error rather than a guess."""
    if array.dtype == np.bool_ and array.size and int(array.view(np.uint8).max()) > 1:
        from ..errors import UserError, quoted
        raise UserError(f"{quoted(path)}: bool tensor {quoted(name)} holds bytes other than 0 and 1; "
                        "the file is corrupt: re-save or re-download it")
    return array


WRITE_PIECE = 64 << 10  # bytes per write() of tensor data; larger than the output's buffer (atomic.BUFFER)


def write_block(file, block: np.ndarray) -> None:
    """A C-ordered array's bytes, straight from its buffer, 64 KiB a write (as `cp` moves them):
    the kernel backs a larger write with larger page-cache folios, and on a virtual machine whose
    freed memory went back to the host those cost far more per byte. Measured here, writing 1 GB
    after 1 GB was freed: 16 MiB writes 4.5 s, 256 KiB 0.35 s; 6 GB after 6.6 GB was freed:
    256 KiB writes 18 s, 64 KiB 2.5 to 10 s."""
    raw = memoryview(block.reshape(-1)).cast("B")
    for start in range(0, len(raw), WRITE_PIECE):
        file.write(raw[start:start + WRITE_PIECE])


def write_tensors(file, position: int, infos, produce, before=None, after: bytes = b"", progress=None,
                  on_data=None) -> int:
    """Each info's tensor `produce(info)`, slab by slab (layout.c_order_blocks), preceded by the
    bytes `before(info)` and followed by `after`: the data part that every writer shares.
    `on_data(info, offset)` is called once a tensor's bytes are all written (offset: where they
    start), `progress(nbytes)` after each tensor. `position` is where the file stands now;
    returns where it stands after (counted, not asked of the file: no seek per tensor)."""
    offset = None
    for info, block, last in c_order_blocks(infos, produce):
        if offset is None:
            if before is not None:
                position += file.write(before(info))
            offset = position
        write_block(file, block)
        position += block.nbytes
        if last:
            if on_data is not None:
                on_data(info, offset)
            if after:
                position += file.write(after)
            offset = None
            if progress is not None:
                progress(info.nbytes)
    return position


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # logical dtype, see converter.dtypes
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python integers: exact at any size

    @property
    def nbytes(self) -> int:
        return self.numel * dtypes.itemsize(self.dtype)

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


class Source:
    """A checkpoint opened for reading.

    `infos` lists every tensor in file order; `read(name)` returns its storage
    array (bf16 as uint16 bits). `notes` says what was unwrapped or stripped.
    """

    path: str

    def __init__(self, path: str):
        self.path = path
        self.infos: dict[str, TensorInfo] = {}
        self.notes: list[str] = []
        self.files: list[str] = [os.path.abspath(path)]  # every file read (an index and its shards)

    def read(self, name: str) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def reference(self, name: str) -> np.ndarray:
        """The tensor as `read` gives it, decoded by a second path that shares no step with `read`
        where the format has one (torch's files: torch_reference.py, or torch.load's own tensors), for
        the conversion's self-check: a defect of the reader cannot pass a check made by itself."""
        return self.read(name)

    def release(self, name: str) -> None:
        """The caller is done with this tensor for now: let its memory go."""

    def check_unchanged(self) -> None:
        """Raise a UserError when a file read has changed since it was opened (see io/stable.py);
        a view of another source asks that one."""
        inner = getattr(self, "inner", None)
        if isinstance(inner, Source):
            inner.check_unchanged()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RenamedSource(Source):
    """A view of another source whose key names lost a wrapper prefix."""

    def __init__(self, inner: Source, prefix: str):
        super().__init__(inner.path)
        self.inner = inner
        self.files = inner.files
        self.notes = list(inner.notes) + [f"stripped the prefix '{prefix}' from every key"]
        self._orig: dict[str, str] = {}
        for name, info in inner.infos.items():
            new = name[len(prefix):]
            self._orig[new] = name
            self.infos[new] = TensorInfo(new, info.dtype, info.shape)

    def read(self, name: str) -> np.ndarray:
        return self.inner.read(self._orig[name])

    def reference(self, name: str) -> np.ndarray:
        return self.inner.reference(self._orig[name])

    def release(self, name: str) -> None:
        self.inner.release(self._orig[name])

    def close(self) -> None:
        self.inner.close()


WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def strip_wrapper_prefixes(source: Source) -> Source:
    """Strip `module.` (DataParallel) and `_orig_mod.` (torch.compile) when every key has it."""
    while source.infos:
        for prefix in WRAPPER_PREFIXES:
            if all(name.startswith(prefix) for name in source.infos):
                source = RenamedSource(source, prefix)
                break
        else:
            return source
    return source
