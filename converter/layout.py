"""Fast layout changes for large tensors.

numpy copies a transposed 2-D view element by element across the whole matrix, which
thrashes the cache (about 0.24 GB/s here for bf16); copying it in bands of 16 rows keeps both
sides in cache (about 1.4 GB/s for 2-byte elements, 2.5 GB/s for 4-byte ones; bands of 32 rows
or more are half as fast on this machine). Comparing a transposed view with a C-ordered array
works the same way, band by band, without laying either out first.

`row_blocks` cuts a tensor into slabs of whole leading-axis rows, so that a writer can lay out,
write and check a large tensor a few MiB at a time.
"""

from __future__ import annotations

import numpy as np

from .pipeline import prefetch

BAND = 16  # rows of the transposed side per step of a copy; fastest here for 2- and 4-byte elements
COMPARE_BAND = 16  # the same when comparing
CHUNK = 4 << 20  # bytes per step when comparing two C-ordered arrays
BLOCK = 16 << 20  # bytes of a tensor laid out and written at a time


def _transposed_base(a: np.ndarray):
    """The 2-D array with contiguous rows that `a` is the transpose of, or None. A slab of rows of a
    transposed matrix is one too (its base's rows are contiguous, only farther apart)."""
    if a.ndim == 2 and not a.flags.c_contiguous and a.shape[0] > 1 and a.strides[0] == a.itemsize:
        return a.T
    return None


def contiguous(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`a` in C order, copying (into `out`, when given) only when needed and transposing in bands."""
    if a.flags.c_contiguous:
        return a
    if out is None:
        out = np.empty(a.shape, dtype=a.dtype)
    base = _transposed_base(a)
    if base is None or base.shape[0] < 2 * BAND:
        np.copyto(out, a)
        return out
    for i in range(0, base.shape[0], BAND):
        out[:, i:i + BAND] = base[i:i + BAND].T
    return out


def row_blocks(a: np.ndarray, nbytes: int) -> list:
    """Indexes that cut `a` into slabs of whole rows of its first axis, about `nbytes` each
    (one row at least; `...`, the whole array, when it is small or has no axis)."""
    if a.ndim == 0 or a.nbytes <= nbytes:
        return [...]
    rows = max(1, nbytes // (a.nbytes // a.shape[0]))
    return [slice(i, i + rows) for i in range(0, a.shape[0], rows)]


def c_order_blocks(infos, produce, nbytes: int | None = None):
    """(info, block, last) for each info's tensor `produce(info)`, slab by slab of rows: each
    block C-ordered (laid out ahead on a worker thread, see pipeline.prefetch), `last` on the
    tensor's final slab. A large tensor is never laid out whole, and its first slabs are written
    while the next ones are laid out. A block is valid until the next one is asked for: its
    memory is then reused (fresh memory costs a page fault per page)."""
    nbytes = nbytes or BLOCK
    spare = []  # buffers of `nbytes` given back; only the worker takes them

    def slabs():
        for info in infos:
            array = produce(info)
            index = row_blocks(array, nbytes)
            for k, rows in enumerate(index):
                yield info, array[rows], k == len(index) - 1

    def lay_out(item):
        info, view, last = item
        if view.flags.c_contiguous:
            return info, view, last, None
        buffer = spare.pop() if spare and view.nbytes <= nbytes else np.empty(max(view.nbytes, nbytes), np.uint8)
        out = buffer[:view.nbytes].view(view.dtype).reshape(view.shape)
        return info, contiguous(view, out), last, buffer

    for info, block, last, buffer in prefetch(lay_out, slabs(), lambda item: item[1].nbytes):
        yield info, block, last
        if buffer is not None and buffer.size == nbytes:
            spare.append(buffer)


def bits(a: np.ndarray) -> np.ndarray:
    """The same memory as unsigned integers, so that equality is bit equality (NaN == NaN)."""
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def _flat_equal(got: np.ndarray, expected: np.ndarray) -> bool:
    """Two C-ordered arrays hold the same bytes; compared a few MiB at a time (no array of
    booleans the size of the tensor)."""
    got, expected = got.reshape(-1).view(np.uint8), expected.reshape(-1).view(np.uint8)
    return all(np.array_equal(got[i:i + CHUNK], expected[i:i + CHUNK]) for i in range(0, got.size, CHUNK))


def bit_equal(got: np.ndarray, expected: np.ndarray) -> bool:
    """Bit-for-bit equality of two arrays of one shape. When one is the transpose of an array
    with contiguous rows and the other is C-ordered, they are compared band by band of the
    transposed one's rows, so that nothing is copied and both bands stay in cache."""
    if got.shape != expected.shape or got.dtype.itemsize != expected.dtype.itemsize:
        return False
    got, expected = bits(got), bits(expected)
    if got.flags.c_contiguous and expected.flags.c_contiguous:
        return _flat_equal(got, expected)
    for plain, turned in ((got, expected), (expected, got)):
        base = _transposed_base(turned)
        if base is not None and plain.flags.c_contiguous:
            return all(np.array_equal(base[i:i + COMPARE_BAND].T, plain[:, i:i + COMPARE_BAND])
                       for i in range(0, base.shape[0], COMPARE_BAND))
    return bool(np.array_equal(contiguous(got), contiguous(expected)))
