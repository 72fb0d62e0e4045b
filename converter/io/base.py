"""What every checkpoint source provides."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..errors import UserError, quoted
from ..layout import c_order_blocks


MAX_DIMS = 64
MAX_BYTES = 1 << 62  # what numpy and torch can address; a shape past it is not a real tensor
MAX_REPEATED = 1 << 30  # bytes a checkpoint's views may show beyond the elements they read (expanded views)


def check_repeats(path: str, views) -> None:
    """The bytes that a file's views of (numel, storage numel, item size) show beyond what their
    storages hold, bounded by MAX_REPEATED (0 for views that repeat no element). An expanded view
    (x.expand(4, 3) saved as it is) is valid torch storage and is written out as the values it
    shows, but a 4-byte storage viewed as 2**31 elements would ask for 8 GB of output."""
    repeated = sum(max(numel - held, 0) * itemsize for numel, held, itemsize in views)
    if repeated > MAX_REPEATED:
        raise UserError(f"{quoted(path)}: its views repeat stored elements into {repeated} bytes more than it stores "
                        f"(expanded views; at most {MAX_REPEATED >> 30} GiB are written out); save them with .contiguous()")


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
        raise UserError(f"{quoted(path)}: bool tensor {quoted(name)} holds bytes other than 0 and 1; "
                        "the file is corrupt: re-save or re-download it")
    return array


def write_tensors(file, position: int, infos, produce, before=None, after: bytes = b"", progress=None,
                  on_data=None, copied=None) -> int:
    """Each info's tensor `produce(info)`, slab by slab (layout.c_order_blocks), preceded by the
    bytes `before(info)` and followed by `after`: the data part that every writer shares.
    `copied(info)`, where given (the file has copy_from, sink.OutputFile), says where a tensor's
    bytes lie unchanged in a source file, (StableFile, offset, nbytes), or None: those are copied
    in the kernel, never produced. `on_data(info, offset)` is called once a tensor's bytes are all
    written (offset: where they start), `progress(nbytes)` after each tensor. `position` is where
    the file stands now; returns where it stands after (counted, not asked of the file)."""
    def produced(info):  # a copied tensor passes as an empty array
        return np.empty(0, dtypes.storage(info.dtype)) if isinstance(info, _Copied) else produce(info)
    offset = None
    for info, block, last in c_order_blocks(_marked(infos, copied), produced):
        if offset is None:
            if before is not None:
                position += file.write(before(info.real if isinstance(info, _Copied) else info))
            offset = position
        if isinstance(info, _Copied):
            file.copy_from(info.file, info.offset, info.real.nbytes)
            position += info.real.nbytes
            info = info.real
        else:
            position += file.write(block.reshape(-1))  # straight from its buffer (see sink.OutputFile)
        if last:
            if on_data is not None:
                on_data(info, offset)
            if after:
                position += file.write(after)
            offset = None
            if progress is not None:
                progress(info.nbytes)
    return position


class _Copied:
    """A tensor copied from its source file: it passes the layout worker as an empty tensor (in
    its place among the others, holding no memory), and the writer copies `real`'s bytes."""

    def __init__(self, real, file, offset: int):
        self.real, self.file, self.offset = real, file, offset
        self.name, self.dtype, self.shape, self.nbytes = real.name, real.dtype, (0,), 0


def _marked(infos, copied):
    for info in infos:
        found = copied(info) if copied is not None else None
        yield info if found is None else _Copied(info, found[0], found[1])


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
    _file = None  # the one file a source reads (a StableFile, io/stable.py), where it reads one

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

    def byte_range(self, name: str):
        """(StableFile, offset, nbytes) where the tensor's bytes lie in C order, unchanged, in a
        file (read as `read` reads it), or None; a writer copies such bytes without reading them."""
        return None

    def release(self, name: str) -> None:
        """The caller is done with this tensor for now: let its memory go."""

    def check_unchanged(self) -> None:
        """Raise a UserError when a file read has changed since it was opened (see io/stable.py);
        a view of another source asks that one."""
        inner = getattr(self, "inner", None)
        if isinstance(inner, Source):
            inner.check_unchanged()
        if self._file is not None:
            self._file.check_unchanged()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

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

    def byte_range(self, name: str):
        return self.inner.byte_range(self._orig[name])

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
