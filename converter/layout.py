"""Fast layout changes for large tensors.

numpy copies a transposed 2-D view element by element across the whole matrix, which
thrashes the cache (about 0.24 GB/s here for bf16); copying it in bands of 16 rows keeps both
sides in cache (about 1.3 GB/s for 2-byte elements, 2.5 GB/s for 4-byte ones; bands of 32 rows
or more are half as fast on this machine). For elements of up to 4 bytes, moving 16-byte words
(numpy's 16-byte void items: 4 floats or 8 bf16 values each) and dealing each word out to its
rows afterwards is faster still: numpy's per-step cost is paid for a quarter or an eighth as many
items (2.9 to 4.3 GB/s for float32, 2.4 to 2.6 GB/s for bf16, against 2.3 to 2.7 in bands).
Comparing a transposed view with a C-ordered array lays the transposed side out a window of
rows at a time, with a loop of its own, and compares bytes.

`row_blocks` cuts a tensor into slabs of whole leading-axis rows, so that a large tensor is laid
out, written, and read back and checked a few MiB at a time.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .pipeline import SLACK, prefetch

BAND = 16  # rows of the transposed side per step of a copy; fastest here for 2- and 4-byte elements
COMPARE_BAND = 16  # the same when comparing
COMPARE_WINDOW, COMPARE_ROWS = 8 << 20, 256  # rows laid out per step of a comparison: this many bytes, at least so many rows
CHUNK = 4 << 20  # bytes per step when comparing two C-ordered arrays
BLOCK = 16 << 20  # bytes of a tensor laid out and written at a time
WORD = 16  # bytes a narrow element's transpose moves at a time (a numpy void item of this size)
_WORD_TYPE = np.dtype(f"V{WORD}")
_local = threading.local()


def _transposed_base(a: np.ndarray):
    """The 2-D array with contiguous rows that `a` is the transpose of, or None. A slab of rows of a
    transposed matrix is one too (its base's rows are contiguous, only farther apart)."""
    if a.ndim == 2 and not a.flags.c_contiguous and a.shape[0] > 1 and a.strides[0] == a.itemsize:
        return a.T
    return None


def _transpose_in_bands(out: np.ndarray, base: np.ndarray) -> None:
    for i in range(0, base.shape[0], BAND):
        out[:, i:i + BAND] = base[i:i + BAND].T


def _transpose_words(out: np.ndarray, base: np.ndarray, scratch: np.ndarray) -> None:
    """out = base.T for elements of up to 4 bytes, moving 16-byte words: word c of a base row holds
    that row's elements in out's rows c*k .. c*k+k-1 (k elements a word). The words are transposed
    in bands into `scratch`, then each word is dealt out to its k rows in one streaming pass."""
    k = WORD // base.itemsize
    words = base.view(_WORD_TYPE)  # [n, m // k]
    turned = scratch[:words.nbytes].view(_WORD_TYPE).reshape(words.shape[::-1])
    _transpose_in_bands(turned, words)
    np.copyto(out.reshape(turned.shape[0], k, -1), turned.view(base.dtype).reshape(*turned.shape, k).transpose(0, 2, 1))


def words_fit(base: np.ndarray) -> bool:
    """A matrix with contiguous rows that 16-byte words tile: elements of up to 4 bytes, rows of whole words."""
    return base.itemsize in (1, 2, 4) and base.shape[1] * base.itemsize % WORD == 0


def contiguous(a: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """`a` in C order, copying (into `out`, when given) only when needed and transposing in bands
    (through `scratch`, bytes at least a.nbytes long, when given and the elements allow words)."""
    if a.flags.c_contiguous:
        return a
    if out is None:
        out = np.empty(a.shape, dtype=a.dtype)
    base = _transposed_base(a)
    if base is None or base.shape[0] < 2 * BAND:
        np.copyto(out, a)
    elif words_fit(base):
        if scratch is None or scratch.size < a.nbytes:
            scratch = np.empty(a.nbytes, np.uint8)
        _transpose_words(out, base, scratch)
    else:
        _transpose_in_bands(out, base)
    return out


def row_blocks(shape: tuple[int, ...], itemsize: int, nbytes: int) -> list:
    """Indexes that cut a tensor of `shape` into slabs of whole rows of its first axis, about
    `nbytes` each (one row at least; `...`, the whole tensor, when it is small or has no axis)."""
    total = math.prod(shape) * itemsize
    if not shape or total <= nbytes:
        return [...]
    rows = max(1, nbytes // (total // shape[0]))
    rows -= rows % WORD if rows > WORD else 0  # slabs of a transpose in whole words (see _transpose_words)
    return [slice(i, min(i + rows, shape[0])) for i in range(0, shape[0], rows)]


_DRAIN = object()  # in the stream of slabs: lay nothing out ahead of this point


def c_order_blocks(infos, produce, nbytes: int | None = None):
    """(info, block, last) for each info's tensor `produce(info)`, slab by slab of rows: each
    block C-ordered (laid out ahead on a worker thread, see pipeline.prefetch), `last` on the
    tensor's final slab. A large tensor is never laid out whole, and its first slabs are written
    while the next ones are laid out. A tensor larger than the worker's slack is produced only
    once every slab before it has been consumed: the caller's check of the tensor before (which
    holds it) is then under way or done, so that at most two large tensors are in memory (a
    transposed one's first slab reads all of it; producing it while the check still held the
    one two before made three). A block is valid until the next one is asked for: its
    memory is then reused (fresh memory costs a page fault per page)."""
    nbytes = nbytes or BLOCK
    spare = []  # buffers of `nbytes` given back; only the worker takes them
    scratch = np.empty(nbytes + WORD, np.uint8)  # the worker's, for transposes in words

    def slabs():
        for info in infos:
            if info.nbytes > SLACK:
                yield _DRAIN  # every slab before it is consumed before this tensor is produced
            array = produce(info)
            index = row_blocks(array.shape, array.itemsize, nbytes)
            for k, rows in enumerate(index):
                yield info, array[rows], k == len(index) - 1

    def lay_out(item):
        if item is _DRAIN:
            return item
        info, view, last = item
        if view.flags.c_contiguous:
            return info, view, last, None
        buffer = spare.pop() if spare and view.nbytes <= nbytes else np.empty(max(view.nbytes, nbytes), np.uint8)
        out = buffer[:view.nbytes].view(view.dtype).reshape(view.shape)
        return info, contiguous(view, out, scratch), last, buffer

    def held(item):  # a slab laid out holds a whole buffer: the buffers in use stay within the slack (and one in hand)
        if item is _DRAIN:
            return SLACK
        view = item[1]
        return view.nbytes if view.flags.c_contiguous else max(view.nbytes, nbytes)

    for item in prefetch(lay_out, slabs(), held):
        if item is _DRAIN:
            continue
        info, block, last, buffer = item
        yield info, block, last
        if buffer is not None and buffer.size == nbytes:
            spare.append(buffer)


def bits(a: np.ndarray) -> np.ndarray:
    """The same memory as unsigned integers, so that equality is bit equality (NaN == NaN)."""
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def _flat_equal(got: np.ndarray, expected: np.ndarray) -> bool:
    """Two C-ordered arrays hold the same bytes; compared a few MiB at a time (no array of
    booleans the size of the tensor), as 8-byte words."""
    got, expected = got.reshape(-1).view(np.uint8), expected.reshape(-1).view(np.uint8)
    return all(np.array_equal(_words(got[i:i + CHUNK]), _words(expected[i:i + CHUNK])) for i in range(0, got.size, CHUNK))


def _words(raw: np.ndarray) -> np.ndarray:
    """Bytes as 8-byte words where their count allows (a compare per word is 8 times fewer steps)."""
    return raw.view(np.uint64) if raw.size % 8 == 0 else raw


def _check_scratch(nbytes: int) -> np.ndarray:
    """This thread's reused scratch memory for comparisons (fresh memory costs a page fault per page)."""
    buffer = getattr(_local, "scratch", None)
    if buffer is None or buffer.size < nbytes:
        buffer = _local.scratch = np.empty(nbytes, np.uint8)
    return buffer[:nbytes]


def _equal_to_transpose(plain: np.ndarray, base: np.ndarray) -> bool:
    """plain == base.T for a C-ordered `plain`, a window of plain's rows at a time, byte for byte.
    Its own loops, on purpose: the check shares no layout code with the writer's transposes, and
    where words fit, it moves them with a loop of its own (see _equal_in_words)."""
    n, m = base.shape
    k = WORD // plain.itemsize if words_fit(base) else 1
    rows = max(COMPARE_ROWS, COMPARE_WINDOW // (n * plain.itemsize))
    rows = max(k, rows - rows % k)
    size = min(rows, m) * n * plain.itemsize
    scratch = _check_scratch(2 * size)
    for j in range(0, m, rows):
        window = plain[j:j + rows]
        if k > 1:
            same = _equal_in_words(window, base[:, j:j + rows], scratch[:size], scratch[size:])
        else:
            laid = scratch[:window.nbytes].view(plain.dtype).reshape(window.shape)
            for i in range(0, n, COMPARE_BAND):
                laid[:, i:i + COMPARE_BAND] = base[i:i + COMPARE_BAND, j:j + rows].T
            same = _flat_equal(laid, window)
        if not same:
            return False
    return True


def _equal_in_words(window: np.ndarray, columns: np.ndarray, turned: np.ndarray, dealt: np.ndarray) -> bool:
    """window == columns.T, where columns' rows are whole 16-byte words: the words of `columns`
    are transposed in bands, each word's k elements are dealt out to k rows of the window's
    shape, and the result is compared with the window."""
    k = WORD // window.itemsize
    words = columns.view(_WORD_TYPE)  # [n, r // k]: word c of row i holds window[c*k .. c*k+k-1, i]
    n, count = words.shape
    across = turned[:window.nbytes].view(_WORD_TYPE).reshape(count, n)
    for i in range(0, n, COMPARE_BAND):
        across[:, i:i + COMPARE_BAND] = words[i:i + COMPARE_BAND].T
    laid = dealt[:window.nbytes].view(window.dtype).reshape(count, k, n)
    np.copyto(laid, across.view(window.dtype).reshape(count, n, k).transpose(0, 2, 1))
    return _flat_equal(laid, window)


def bit_equal(got: np.ndarray, expected: np.ndarray) -> bool:
    """Bit-for-bit equality of two arrays of one shape. When one is the transpose of an array
    with contiguous rows and the other is C-ordered, the transposed one is laid out a window at
    a time (see _equal_to_transpose), never whole."""
    if got.shape != expected.shape or got.dtype.itemsize != expected.dtype.itemsize:
        return False
    got, expected = bits(got), bits(expected)
    if got.flags.c_contiguous and expected.flags.c_contiguous:
        return _flat_equal(got, expected)
    for plain, turned in ((got, expected), (expected, got)):
        base = _transposed_base(turned)
        if base is not None and plain.flags.c_contiguous:
            return _equal_to_transpose(plain, base)
    return bool(np.array_equal(contiguous(got), contiguous(expected)))
