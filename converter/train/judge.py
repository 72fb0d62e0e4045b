"""One comparison against its budget: the difference of paddle's value from torch's, judged by
the error budget of the forward check built from torch's own fp32 error against float64 (and
whatever the conventions or formats add); and what a gradient's row says besides (paddle's gradient
zero where torch's is not, or torch's times a factor)."""

from __future__ import annotations

import math

import numpy as np

from ..compare.budget import TRAINING, budget_for
from .result import SCALED, ZERO, Row

FP32 = {"torch": "fp32", "paddle": "fp32"}
SCALE_FIT = 1e-3  # a factor fits where paddle's gradient differs from torch's times it by this share of its norm
# the sums of squares scale_of takes in float32: above n * the first, what underflows in them (under
# 1.2e-38 each) is under a ten-millionth of them; below the second, no sum it forms overflows
FLOAT32_SUMS = (1e-31, 1e36)


def judge(phase: str, step, torch_name: str, paddle_name: str, want, got, e_ref, extra=0.0,
          formats: dict | None = None, fmt_err=None, note: str = "", e_other=None, condition=None) -> Row:
    """want: torch's value; got: paddle's; e_ref: torch's fp32 value minus its float64 value; extra:
    a further sigma per element (conventions that differ by design); fmt_err: torch's value computed
    in paddle's format (TF32, bf16) minus its float64 value, when paddle uses another format than fp32:
    its rms and each element's own join the budget; e_other: paddle's own value minus its float64
    value, where it was measured (torch's error stands in for it otherwise); condition: per element,
    how far the float64 value moves when its inputs move by one unit in the last place of the format
    a reference computed in (a reference that is not float64 inside): each side's, per element and
    its mean square."""
    want = np.asarray(want, dtype=np.float32)
    got = np.asarray(got)
    if got.shape != want.shape:
        if got.size != want.size:
            return Row(phase, step, torch_name, paddle_name, float("inf"), None, None,
                       f"shapes differ: torch {list(want.shape)}, paddle {list(got.shape)}")
        # the same elements in another shape (a layer called on its input flattened): compared in
        # torch's shape, and said so
        note = f"paddle's {list(got.shape)} compared as torch's {list(want.shape)}" + (f"; {note}" if note else "")
        got = got.reshape(want.shape)
    e_ref = np.asarray(e_ref, dtype=np.float32).reshape(want.shape)
    formats = formats or FP32
    shaped = lambda a: None if a is None or np.size(a) != want.size else np.asarray(a, np.float32).reshape(want.shape)
    extra = np.asarray(extra, dtype=np.float32)  # one for every element, or each element's own
    extra = np.broadcast_to(extra, want.shape) if extra.ndim and extra.shape != want.shape else extra
    condition, e_other, fmt_err = shaped(condition), shaped(e_other), shaped(fmt_err)
    want, got, e_ref, extra, condition, e_other, fmt_err = in_memory_order(want, got, e_ref, extra, condition, e_other,
                                                                           fmt_err)
    # the elements either side computes: where both hold an exact 0 (an embedding's rows no token
    # used) nothing was computed, and the noise of those computed is not averaged with their zeros
    support = (want != 0) | (got != 0) if (want == 0).any() else None
    on = (lambda a: a) if support is None or support.all() else (lambda a: None if a is None else a[support])
    condition, e_other, fmt_err = on(condition), on(e_other), on(fmt_err)
    want, got, e_ref = on(want), on(got), on(e_ref)
    extra = on(extra) if extra.ndim else extra
    rounding = None if fmt_err is None else {formats["paddle"]: fmt_err}
    budget = budget_for(TRAINING, formats, want, e_ref, None, rounding, condition, e_other,
                        conventions=extra if extra.ndim or extra else None)
    with np.errstate(invalid="ignore", over="ignore"):
        # float32 values differ by their difference rounded once to float32, wider ones in float64 first
        narrow = got.dtype.kind == "f" and got.dtype.itemsize <= 4
        diff = np.subtract(got, want, dtype=np.float32 if narrow else np.float64)
        diff = np.abs(diff, out=diff) if diff.dtype == np.float32 else np.abs(diff).astype(np.float32)
    ratio, tol = budget.ratio(diff)
    worst = float(np.fmax.reduce(diff, axis=None)) if diff.size else 0.0  # nan where every element is nan
    return Row(phase, step, torch_name, paddle_name, ratio, worst, tol, note)


def in_memory_order(first: np.ndarray, *rest) -> list:
    """`first` and the arrays of `rest` (each of first's shape, a broadcast to it, a scalar or None) with
    their axes in the order `first`'s elements lie in memory, so that a transposed view of torch's values
    is read in one pass rather than copied at each step of a budget; each array of `rest` that is not then
    C-contiguous (a broadcast aside) is laid out so, in bands (numpy's strided copy of a large transposed
    matrix is ten times slower). Elementwise, every array corresponds to `first` as before."""
    from ..layout import contiguous
    order = _memory_order(first)
    turned = (lambda a: a) if order is None else (lambda a: a.transpose(order))
    laid = lambda a: a if a is None or not a.ndim else turned(a) if 0 in a.strides else contiguous(turned(a))
    return [turned(first)] + [laid(a) for a in rest]


def _memory_order(a: np.ndarray) -> tuple | None:
    """The order of `a`'s axes that makes it C-contiguous (a transpose of a contiguous array read back
    as that array), or None where it is C-contiguous already or no order of its axes makes it so."""
    if a.ndim < 2 or a.flags.c_contiguous:
        return None
    order = tuple(sorted(range(a.ndim), key=lambda i: -a.strides[i]))
    return order if a.transpose(order).flags.c_contiguous else None


def zero_note(torch_grad, paddle_grad) -> str:
    """ZERO where paddle's gradient is zero and torch's is not, else ''."""
    return ZERO if not np.any(paddle_grad) and np.any(torch_grad) else ""


def gradient_note(torch_grad, paddle_grad) -> str:
    """ZERO where paddle's gradient is zero and torch's is not; SCALED and the factor where paddle's
    is torch's times a constant other than 1 (a custom backward that scales what it passes on); else ''."""
    zero = zero_note(torch_grad, paddle_grad)
    if zero:
        return zero
    factor = scale_of(torch_grad, paddle_grad)
    return "" if factor is None else f"{SCALED}{factor:.4g}; "


def scale_of(torch_grad, paddle_grad) -> float | None:
    """The constant paddle's gradient is torch's times (least squares), where it fits within
    SCALE_FIT of paddle's norm and is not 1 within that; else None."""
    a, b = np.asarray(torch_grad), np.asarray(paddle_grad)
    if a.shape != b.shape:
        return None
    a, b = (x.ravel() for x in in_memory_order(a, b))  # one order for both, copied in bands where it must be
    if a.dtype != np.float32 or b.dtype != np.float32:
        a, b = a.astype(np.float64), b.astype(np.float64)
    norm_a, norm_b = _sum_of(a, a), _sum_of(b, b)  # squared norms: finite where every element is
    low, high = a.size * FLOAT32_SUMS[0], FLOAT32_SUMS[1]
    if a.dtype == np.float32 and not (low < norm_a < high and low < norm_b < high):
        a, b = a.astype(np.float64), b.astype(np.float64)  # float32 would overflow or lose what underflows
        norm_a, norm_b = _sum_of(a, a), _sum_of(b, b)
    if not (math.isfinite(norm_a) and math.isfinite(norm_b)) or norm_a == 0 or norm_b == 0:
        return None
    factor = _sum_of(a, b) / norm_a
    if abs(factor - 1) <= SCALE_FIT:  # 1 within the fit: no factor to say, whatever the rest
        return None
    rest = np.multiply(a, a.dtype.type(-factor))
    rest += b
    return factor if _sum_of(rest, rest) <= SCALE_FIT ** 2 * norm_b else None


def _sum_of(x: np.ndarray, y: np.ndarray) -> float:
    """sum(x * y) in their dtype, summed pairwise (within a few units of it, where BLAS's dot may not be)."""
    return float(np.add.reduce(np.multiply(x, y)))
