"""What the backward's rows say in their notes (paddle's gradient zero, or torch's times a factor; the
layer a local row belongs to, its forward differing too), and the culprit read from them: the first
layer in backward order over budget none of whose paired sublayers is over budget (when the
sublayers agree but their parent does not, the parent's own code is at fault)."""

from __future__ import annotations

import math

import numpy as np

from ..paths import is_under
from .judge import in_memory_order

FORWARD_DIFFERS = " (its forward differs too)"
ZERO = "paddle's gradient is zero; "
SCALED = "paddle's gradient is torch's times "  # then the factor and "; "
SCALE_FIT = 1e-3  # a factor fits where paddle's gradient differs from torch's times it by this share of its norm
LOCAL = "local backward of "
# the sums of squares scale_of takes in float32: above n * the first, what underflows in them (under
# 1.2e-38 each) is under a ten-millionth of them; below the second, no sum it forms overflows
FLOAT32_SUMS = (1e-31, 1e36)


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
    fits = _sum_of(rest, rest) <= SCALE_FIT ** 2 * norm_b
    return factor if fits and abs(factor - 1) > SCALE_FIT else None


def _sum_of(x: np.ndarray, y: np.ndarray) -> float:
    """sum(x * y) in their dtype, summed pairwise (within a few units of it, where BLAS's dot may not be)."""
    return float(np.add.reduce(np.multiply(x, y)))


def scale_in(row) -> str | None:
    """The factor a row's note says paddle's gradient is torch's times, as written there; else None."""
    _, found, rest = row.note.partition(SCALED)
    return rest.partition(";")[0] if found else None


def layer_of(row) -> str:
    """The layer of a row of the per-layer backward ('' for another row)."""
    _, found, layer = row.note.partition(LOCAL)
    return layer.removesuffix(FORWARD_DIFFERS) if found else ""


def culprit(rows: list):
    """The first bad local row in backward order whose layer has no bad paired sublayer; else the
    first bad row (an end-to-end gradient)."""
    bad = [r for r in rows if r.phase == "backward" and r.bad]
    local = [r for r in bad if layer_of(r)]
    bad_layers = {layer_of(r) for r in local}
    for r in local:
        here = layer_of(r)
        path = "" if here == "<model>" else here
        if not any(o != here and is_under("" if o == "<model>" else o, path) for o in bad_layers):
            return r
    return bad[0] if bad else None
