"""How two tensors holding the same values are laid out against each other, and how near they are.

Two ports hold one value in shapes that differ: broadcast (`[1, T]` against `[B, T]`), with
axes of size 1 dropped (`[B, C, 1, 1]` against `[B, C]`), with leading axes merged (`[B*T, H]`
against `[B, T, H]`), or with their axes in another order (a block that runs sequence-first on
one side, `[T, B, C]`, and batch-first on the other). These are the shapes both are compared in,
and the closeness of their values (see same_values).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

MATCH_RTOL = 5e-2
MAX_AXES_PERMUTED = 5  # tensors of up to this many axes are tried in every order of their axes


def common_shape(a: tuple, b: tuple) -> tuple | None:
    """The shape both are compared in: where they hold as many elements in the same order and
    differ only in axes of size 1 ([B, C, 1, 1] against [B, C]), the one of fewer axes, never the
    grid broadcasting would make of them; else the one both broadcast to, else the one that merges
    the other's leading axes (see merged_shape); None when there is none."""
    squeezed = squeezed_alike(tuple(a), tuple(b))
    if squeezed is not None:
        return squeezed
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return merged_shape(tuple(a), tuple(b))


def squeezed_alike(a: tuple, b: tuple) -> tuple | None:
    """Of two shapes that differ only in axes of size 1 where broadcasting them would make a grid of
    more elements than either holds ([B, C, 1, 1] and [B, C]), the one with fewer axes; else None
    ([1, T, H] and [T, H] broadcast to the same elements: left to broadcasting)."""
    if a == b or [d for d in a if d != 1] != [d for d in b if d != 1]:
        return None
    try:
        if math.prod(np.broadcast_shapes(a, b)) == math.prod(a):
            return None
    except ValueError:
        pass
    return a if len(a) <= len(b) else b


def merged_shape(a: tuple, b: tuple) -> tuple | None:
    """Of two shapes that differ only in that one merges the other's leading axes into one (HF
    OPT runs its feed-forward on [B*T, H] where PaddleNLP keeps [B, T, H]: the same elements in
    the same order), the merged one; else None."""
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    lead_a, lead_b = a[:len(a) - n], b[:len(b) - n]
    if min(len(lead_a), len(lead_b)) != 1 or max(len(lead_a), len(lead_b)) < 2 \
            or math.prod(lead_a) != math.prod(lead_b):
        return None
    return a if len(a) < len(b) else b


def lay_out(array: np.ndarray, shape: tuple) -> np.ndarray:
    """`array` in the shape common_shape gave: as it is, merged or split along its leading axes,
    or broadcast."""
    shape = tuple(shape)
    if tuple(array.shape) == shape:
        return array
    if array.size == math.prod(shape) and (merged_shape(tuple(array.shape), shape) is not None
                                           or squeezed_alike(tuple(array.shape), shape) is not None):
        return array.reshape(shape)
    return np.broadcast_to(array, shape)


def laid_out_alike(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays numpy can broadcast against each other: as they are, or the one whose leading
    axes the other merges reshaped to match."""
    merged = squeezed_alike(tuple(a.shape), tuple(b.shape)) or merged_shape(tuple(a.shape), tuple(b.shape))
    if merged is None or a.size != b.size:
        return a, b
    return a.reshape(merged), b.reshape(merged)


def kind(a: np.ndarray) -> str:
    if a.dtype == np.bool_:
        return "b"
    return "f" if np.issubdtype(a.dtype, np.floating) else "i"


def distance(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over b's largest magnitude after broadcasting (inf when they cannot be the
    same values: other kinds, shapes that do not broadcast, NaN in other places)."""
    d = same_values(a, b, rtol=np.inf)
    return np.inf if d is None else d


def same_values(a: np.ndarray, b: np.ndarray, rtol: float = MATCH_RTOL) -> float | None:
    """How far apart two tensors are when they hold the same values up to broadcasting (0 for
    equal), relative to b's largest magnitude; None when they do not."""
    if kind(a) != kind(b) or common_shape(a.shape, b.shape) is None:
        return None
    if a.size == 0 or b.size == 0:
        return 0.0 if a.size == b.size else None
    a, b = laid_out_alike(a, b)
    if kind(a) != "f":
        return 0.0 if np.array_equal(*np.broadcast_arrays(a, b)) else None
    with np.errstate(invalid="ignore", over="ignore"):
        if a.dtype == b.dtype == np.float32:  # the common case, at half the traffic: no NaN or Inf anywhere
            d = np.abs(np.subtract(a, b))
            worst = float(d.max(initial=0.0))
            if np.isfinite(worst):
                scale = float(np.abs(b).max(initial=0.0))
                if np.isfinite(scale):
                    return _relative(worst, scale, rtol)
        d = np.abs(np.subtract(a, b, dtype=np.float64))
        finite = np.isfinite(d)
        if not finite.all():  # the same NaN and Inf positions count as equal
            x, y = np.broadcast_arrays(a, b)
            if not np.array_equal(np.isnan(x), np.isnan(y)) or not np.array_equal(np.where(np.isinf(x), x, 0),
                                                                                  np.where(np.isinf(y), y, 0)):
                return None
            d = np.where(finite, d, 0.0)
        scale = float(np.max(np.abs(np.where(np.isfinite(b), b, 0.0)), initial=0.0))
    return _relative(float(d.max(initial=0.0)), scale, rtol)


def _relative(worst: float, scale: float, rtol: float) -> float | None:
    if worst == 0.0:
        return 0.0
    if scale == 0:
        return np.inf if rtol == np.inf else None
    return worst / scale if worst <= rtol * scale else None


def fit(array: np.ndarray, shape: tuple) -> np.ndarray | None:
    """`array`'s values laid out as `shape`: broadcast up, or, along the axes where `shape` has 1
    and `array` does not, its first slice when every slice is the same. None when neither works."""
    shape = tuple(shape)
    if tuple(array.shape) == shape:
        return array
    if common_shape(array.shape, shape) == shape or merged_shape(tuple(array.shape), shape) is not None:
        return lay_out(array, shape)
    if len(shape) != array.ndim:
        return None
    out = array
    for axis, (want, have) in enumerate(zip(shape, array.shape)):
        if want == have:
            continue
        if want != 1:
            return None
        first = np.take(out, [0], axis=axis)
        if not np.array_equal(np.broadcast_to(first, out.shape), out):
            return None
        out = first
    return out


def orders_to(shape: tuple, wanted: tuple) -> list[tuple]:
    """The orders of the axes of a tensor of `shape` (other than as it is) that give `wanted`."""
    shape, wanted = tuple(shape), tuple(wanted)
    if len(shape) != len(wanted) or len(shape) > MAX_AXES_PERMUTED or sorted(shape) != sorted(wanted):
        return []
    identity = tuple(range(len(shape)))
    return [order for order in itertools.permutations(identity)
            if order != identity and tuple(shape[k] for k in order) == wanted]


def axes_order(t: np.ndarray, p: np.ndarray, rtol: float = MATCH_RTOL) -> tuple | None:
    """The order of p's axes (other than as it is) that lays p out as t, chosen by value among the
    orders that give t's shape, where those values are then the same ones (see same_values, within
    `rtol`: inf takes the nearest of them); None when no order does."""
    gaps = {order: same_values(np.transpose(p, order), t, rtol) for order in orders_to(p.shape, t.shape)}
    found = {order: d for order, d in gaps.items() if d is not None}
    return min(found, key=found.get) if found else None


def undone(order: tuple | None) -> tuple | None:
    """The order of axes that puts back what `order` moved."""
    return None if order is None else tuple(int(k) for k in np.argsort(order))


def in_order(item, order: tuple | None, shape: tuple | None = None):
    """`item` (numpy or paddle) with its axes in `order`, where `order` is given (and, with `shape`,
    where that lays it out as `shape`)."""
    if order is None or (shape is not None and (tuple(item.shape) == tuple(shape)
                                                or tuple(item.shape[k] for k in order) != tuple(shape))):
        return item
    return np.transpose(item, order) if isinstance(item, np.ndarray) else item.transpose(list(order))
