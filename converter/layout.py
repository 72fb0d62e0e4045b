"""Fast layout changes for large tensors.

numpy copies a transposed 2-D view element by element across the whole matrix,
which thrashes the cache (about 0.7 GB/s here); copying it in bands of rows
keeps both sides in cache (about 2.4 GB/s). Comparing a transposed view with a C-ordered
array works the same way, band by band, without laying either out first.
"""

from __future__ import annotations

import numpy as np

BAND = 128
COMPARE_BAND = 32  # rows of the transposed side per step when comparing; fastest here


def _transposed_base(a: np.ndarray):
    """The C-contiguous 2-D array that `a` is the transpose of, or None."""
    if a.ndim == 2 and a.T.flags.c_contiguous and not a.flags.c_contiguous:
        return a.T
    return None


def contiguous(a: np.ndarray) -> np.ndarray:
    """`a` in C order, copying only when needed and transposing in bands."""
    if a.flags.c_contiguous:
        return a
    base = _transposed_base(a)
    if base is None or base.shape[0] < 2 * BAND:
        return np.ascontiguousarray(a)
    out = np.empty(a.shape, dtype=a.dtype)
    for i in range(0, base.shape[0], BAND):
        out[:, i:i + BAND] = base[i:i + BAND].T
    return out


def bits(a: np.ndarray) -> np.ndarray:
    """The same memory as unsigned integers, so that equality is bit equality (NaN == NaN)."""
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def bit_equal(got: np.ndarray, expected: np.ndarray) -> bool:
    """Bit-for-bit equality of two arrays of one shape. When one is the transpose of a
    C-ordered array and the other is C-ordered, they are compared band by band of the
    transposed one's rows, so that nothing is copied and both bands stay in cache."""
    if got.shape != expected.shape or got.dtype.itemsize != expected.dtype.itemsize:
        return False
    got, expected = bits(got), bits(expected)
    if got.flags.c_contiguous and expected.flags.c_contiguous:
        return bool(np.array_equal(got, expected))
    for plain, turned in ((got, expected), (expected, got)):
        base = _transposed_base(turned)
        if base is not None and plain.flags.c_contiguous:
            return all(np.array_equal(base[i:i + COMPARE_BAND].T, plain[:, i:i + COMPARE_BAND])
                       for i in range(0, base.shape[0], COMPARE_BAND))
    return bool(np.array_equal(contiguous(got), contiguous(expected)))
