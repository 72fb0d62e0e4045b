"""Attention masks read by what they mean: which positions they mask.

Ports write one mask in several forms: a keep-mask of 1s and 0s (HF's attention_mask, 0 masks a
position), an additive mask (0 where kept, a large negative value where masked: -10000, -inf,
float32's lowest), or a boolean one (True keeps a position in paddle's attention and torch's
scaled_dot_product_attention, True masks it in torch's key_padding_mask). Two masks of other
forms that mask the same positions are the same mask; one handed to the other side is written in
the form that side's layer reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shapes import common_shape, fit, laid_out_alike

MASKED_BELOW = -1e3  # an additive mask value at or below this masks its position
ADDITIVE, KEEP, TRUE_KEEPS, TRUE_MASKS = "additive", "keep", "true keeps", "true masks"


def masked_by_torch(y_t: np.ndarray, y64: np.ndarray) -> np.ndarray:
    """Positions torch's fp32 run fills with a mask value and its float64 run with one float32
    cannot hold (float64's lowest, where HF takes finfo(dtype).min): their difference is no drift
    but two mask values, and the other side is judged there as against torch's fp32 value."""
    with np.errstate(invalid="ignore"):
        return (y_t <= MASKED_BELOW) & ~(y64 >= -float(np.finfo(np.float32).max))


def masked_positions(a: np.ndarray) -> np.ndarray | None:
    """The positions a mask masks (True), or None when `a` is not mask-like: a boolean tensor
    (True keeps a position), or an additive float tensor whose values are all 0 or far below 0."""
    if a.dtype == np.bool_:
        return ~a
    if not np.issubdtype(a.dtype, np.floating) or a.ndim < 2:
        return None
    with np.errstate(invalid="ignore"):
        masked = a <= MASKED_BELOW
        if not np.all(masked | (a == 0)) or not masked.any():
            return None
    return masked


@dataclass(frozen=True)
class MaskReading:
    """One way of reading a tensor as a mask: the positions it masks, in which form."""

    masked: np.ndarray
    form: str
    value: float = 0.0  # ADDITIVE: the value it puts where it masks (the lowest it holds)


def readings(a: np.ndarray) -> list[MaskReading]:
    """Every way `a` reads as a mask: a boolean tensor both ways (True keeps, True masks); an
    additive float tensor (values all 0 or far below 0, some below); a keep-mask (integer or
    float, of two or more axes, holding 0s and 1s and nothing else, both of them). [] when `a` is
    no mask."""
    if a.dtype == np.bool_:
        return [MaskReading(~a, TRUE_KEEPS), MaskReading(a, TRUE_MASKS)]
    masked = masked_positions(a)
    if masked is not None:
        with np.errstate(invalid="ignore"):
            return [MaskReading(masked, ADDITIVE, float(np.min(a)))]
    if a.ndim < 2 or a.size == 0 or not np.issubdtype(a.dtype, np.number):
        return []
    zero = a == 0
    if not zero.any() or not np.all(zero | (a == 1)) or zero.all():
        return []
    return [MaskReading(zero, KEEP)]


def _key_window(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two masks cut to the key positions both have: HF sizes its causal mask for the cache
    (one key more than the queries) and slices it to the keys in use."""
    if a.ndim == b.ndim and a.ndim >= 2 and a.shape[-1] != b.shape[-1] and min(a.shape[-1], b.shape[-1]) > 1:
        n = min(a.shape[-1], b.shape[-1])
        return a[..., :n], b[..., :n]
    return a, b


def _with_axes(a: np.ndarray, ndim: int) -> np.ndarray:
    """A mask of two or more axes given `ndim` axes, those added of size 1 after its first ([B, T] as [B, 1, 1, T])."""
    return a.reshape(a.shape[:1] + (1,) * (ndim - a.ndim) + a.shape[1:]) if 2 <= a.ndim < ndim else a


def _keys_alike(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of two masks laid out against each other: a keep-mask [B, T] (per batch, per key)
    against [B, 1, 1, T] or [B, 1, T, T] gets the axes between."""
    return _key_window(_with_axes(a, b.ndim), _with_axes(b, a.ndim))


def _same_positions(a: np.ndarray, b: np.ndarray) -> bool:
    for x, y in (_key_window(a, b), _keys_alike(a, b)):
        if common_shape(x.shape, y.shape) is not None and np.array_equal(*np.broadcast_arrays(*laid_out_alike(x, y))):
            return True
    return False


def agreeing(a: np.ndarray, b: np.ndarray) -> tuple[MaskReading, MaskReading] | None:
    """The readings of `a` and `b` (see readings) under which the two mask the same positions
    (either form, broadcast-compatible shapes, a keep-mask's [B, T] against [B, 1, 1, T]); None
    where none do."""
    ra = readings(a)
    rb = readings(b) if ra else []
    for x in ra:
        for y in rb:
            if x.masked.any() or y.masked.any():
                if _same_positions(x.masked, y.masked):
                    return x, y
    return None


def same_mask(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two masks (any form, broadcast-compatible shapes) mask the same positions."""
    return agreeing(a, b) is not None


def in_form_of(source: np.ndarray, like: np.ndarray) -> np.ndarray | None:
    """The positions `source` masks, written as `like` writes a mask (its form, its masked value,
    its dtype, its shape): what `like`'s side is handed in its place. None where the two do not
    mask the same positions, or `source`'s positions do not lay out as `like`'s shape."""
    found = agreeing(like, source)
    if found is None:
        return None
    mine, theirs = found
    masked = _with_axes(theirs.masked, like.ndim)
    if masked.ndim == like.ndim and masked.ndim >= 2 and masked.shape[-1] > like.shape[-1] > 1:
        masked = masked[..., :like.shape[-1]]
    masked = fit(masked, tuple(like.shape))
    if masked is None:
        return None
    if mine.form == ADDITIVE:
        return np.where(masked, like.dtype.type(mine.value), like.dtype.type(0))
    if mine.form == KEEP:
        return np.where(masked, 0, 1).astype(like.dtype)
    return np.ascontiguousarray(~masked if mine.form == TRUE_KEEPS else masked)


def is_causal(masked: np.ndarray) -> bool:
    """Whether masked positions are exactly those after each query (the strict upper triangle)."""
    return masked.ndim >= 2 and bool(masked.any()) and np.array_equal(masked, np.triu(masked, k=1)) \
        and np.array_equal(np.triu(np.ones(masked.shape[-2:], bool), k=1), masked.reshape(-1, *masked.shape[-2:])[0])


def masked_alike(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Positions where two outputs both hold an additive mask value (at or below MASKED_BELOW):
    T5's position bias carries its mask, HF's as float32's lowest value (float64's in a float64
    run), PaddleNLP's as another; both mean "masked", and their difference is no error. None
    where there are none (checked first by one pass over `a`)."""
    if a.size == 0 or not np.issubdtype(a.dtype, np.floating) or not float(np.min(a)) <= MASKED_BELOW:
        return None
    both = (a <= MASKED_BELOW) & (b <= MASKED_BELOW)
    return both if both.any() else None
