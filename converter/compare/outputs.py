"""Which output of a paired layer is compared with which, and in what shape.

Both sides may return several outputs, in other orders or numbers (PaddleNLP's DeBERTa encoder
returns its input and every hidden state where HF's returns the last one), with axes in another
order, or one side's output a part of the other's. Outputs pair one to one (a rotary embedding's
cos with cos and sin with sin, never both with one), except that outputs one side returns twice
(the same values) share their partner.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .shapes import MATCH_RTOL, axes_order, common_shape, distance, in_order, same_values


@dataclass(frozen=True)
class OutputPairs:
    """Which output of each side is compared with which, and in what shape: by position when both
    sides give one and the shapes broadcast; else one to one by value (see pair_outputs)."""

    torch: tuple = ()
    paddle: tuple = ()
    shapes: tuple = ()
    # per pair, the order of paddle's axes that lays its output out as torch's (HF's q_norm runs
    # on [batch, heads, tokens, dim], PaddleFormers' on [batch, tokens, heads, dim]); None: as it is
    axes: tuple = ()
    # per pair, the part of paddle's output that holds torch's: (axis, start, stop) along one axis
    # (paddle.vision's DenseNet layer returns its input and its new features joined, torchvision's
    # the new features alone); None: all of it
    spans: tuple = ()

    def __len__(self) -> int:
        return len(self.shapes)

    def of_torch(self, items: list) -> list:
        return [items[i] for i in self.torch]

    def of_paddle(self, items: list) -> list:
        """Paddle's items paired with torch's, each laid out as torch's where its axes come in
        another order, and cut to its span where torch's is part of it (an item already in torch's
        shape, as a forced run's is, is taken as it is)."""
        return [_in_span(in_order(items[j], order, shape), span, shape)
                for j, order, span, shape in zip(self.paddle, self.orders(), self.cuts(), self.shapes)]

    def fits(self, paddle_items: list) -> bool:
        """Whether another set of paddle outputs (a forced run's) can stand where these were."""
        return all(j < len(paddle_items)
                   and common_shape(tuple(_in_span(in_order(paddle_items[j], order, s), span, s).shape), s) == s
                   for j, order, span, s in zip(self.paddle, self.orders(), self.cuts(), self.shapes))

    def orders(self) -> tuple:
        """Per pair, the order of paddle's axes (None: as it is)."""
        return self.axes or (None,) * len(self.paddle)

    def cuts(self) -> tuple:
        """Per pair, the span of paddle's output compared (None: all of it)."""
        return self.spans or (None,) * len(self.paddle)


def _span_of(t: np.ndarray, p: np.ndarray) -> tuple | None:
    """(axis, start, stop): where p holds t's values as a run along the one axis their shapes differ
    in, at its start or its end (an output joined to its input); None where it does not."""
    if t.ndim != p.ndim or t.ndim == 0:
        return None
    differ = [k for k in range(t.ndim) if t.shape[k] != p.shape[k]]
    if len(differ) != 1 or p.shape[differ[0]] <= t.shape[differ[0]]:
        return None
    axis, n = differ[0], t.shape[differ[0]]
    found = {}
    for start in sorted({0, p.shape[axis] - n}):
        gap = same_values(np.take(p, range(start, start + n), axis=axis), t)
        if gap is not None:
            found[(axis, start, start + n)] = gap
    return min(found, key=found.get) if found else None


def _in_span(item, span: tuple | None, shape: tuple):
    """`item` (numpy or paddle) cut to `span` where that gives `shape`."""
    if span is None or tuple(item.shape) == tuple(shape):
        return item
    axis, start, stop = span
    if item.ndim <= axis or item.shape[axis] < stop:
        return item
    index = (slice(None),) * axis + (slice(start, stop),)
    return item[index]


def pair_outputs(t_shapes: list, p_shapes: list, t_values=None, p_values=None) -> OutputPairs:
    """OutputPairs for outputs of these shapes. A single output on each side pairs by position
    when the shapes broadcast, else with its axes in the order that holds the same values (the
    nearest order where none does), else by its span; several are paired one to one by value (`*_values()` give the numpy
    arrays; see _one_to_one). One paddle output may answer for two torch outputs only where those
    hold the same values (HF returns the last hidden state, and again among all of them)."""
    if len(t_shapes) == 1 and len(p_shapes) == 1 and (shape := common_shape(t_shapes[0], p_shapes[0])) is not None:
        return OutputPairs((0,), (0,), (shape,))
    if len(t_shapes) == 1 and len(p_shapes) == 1 and t_values is not None and p_values is not None:
        t, p = t_values()[0], p_values()[0]
        order = axes_order(t, p)
        span = _span_of(t, p) if order is None else None
        if order is None and span is None:
            # values too far apart to say which order holds them (a bug before it): the nearest order, so
            # that the difference is measured, not taken for one of shape
            order = axes_order(t, p, rtol=np.inf)
        if order is not None or span is not None:
            return OutputPairs((0,), (0,), (tuple(t_shapes[0]),), (order,), (span,) if span is not None else ())
    if t_values is None or p_values is None:
        shapes = [common_shape(a, b) for a, b in zip(t_shapes, p_shapes)]
        n = next((k for k, s in enumerate(shapes) if s is None), len(shapes))
        return OutputPairs(tuple(range(n)), tuple(range(n)), tuple(shapes[:n]))
    ts, ps = t_values(), p_values()
    out = sorted(_one_to_one(ts, ps).items())
    return OutputPairs(tuple(i for i, _ in out), tuple(j for _, j in out),
                       tuple(common_shape(ts[i].shape, ps[j].shape) for i, j in out))


MAX_ASSIGNMENTS = 1 << 14  # assignments tried one by one at most; beyond, the nearest pairs are taken first


def _groups(arrays: list) -> list[list[int]]:
    """Indices of outputs holding the same values in the same shape, together, in order."""
    groups: list[list[int]] = []
    for k, a in enumerate(arrays):
        home = next((g for g in groups if arrays[g[0]].shape == a.shape and arrays[g[0]].dtype == a.dtype
                     and np.array_equal(arrays[g[0]], a, equal_nan=np.issubdtype(a.dtype, np.inexact))), None)
        if home is None:
            groups.append([k])
        else:
            home.append(k)
    return groups


def _one_to_one(ts: list, ps: list) -> dict[int, int]:
    """torch output index -> paddle output index. Outputs one side returns twice (the same values,
    the same shape) form one group, and groups pair one to one: the assignment that pairs the most
    groups holding the same values (see same_values), then the most that can be compared at all,
    then the most at their own position, then the nearest in all. A pair that cannot be the same
    values (other kinds, NaN elsewhere) is taken at its own position only. Within a pair of
    groups, each torch output takes the paddle output at its own position where there is one."""
    tg, pg = _groups(ts), _groups(ps)
    gap = {}
    for a, g in enumerate(tg):
        for b, h in enumerate(pg):
            t, p = ts[g[0]], ps[h[0]]
            if common_shape(p.shape, t.shape) is None:
                continue
            d = distance(p, t)
            own = bool(set(g) & set(h))
            if d == np.inf and not own:
                continue
            gap[a, b] = (d, own)

    def score(assigned: list) -> tuple:
        ds = [gap[ab][0] for ab in assigned]
        return (sum(d <= MATCH_RTOL for d in ds), len(assigned), sum(gap[ab][1] for ab in assigned),
                -sum(min(d, 1e30) for d in ds))

    options = [[None] + [b for b in range(len(pg)) if (a, b) in gap] for a in range(len(tg))]
    if math.prod(len(o) for o in options) <= MAX_ASSIGNMENTS:
        best: list = []
        for b_of in itertools.product(*options):
            used = [b for b in b_of if b is not None]
            if len(used) != len(set(used)):
                continue
            assigned = [(a, b) for a, b in enumerate(b_of) if b is not None]
            if score(assigned) > score(best):
                best = assigned
    else:
        best, seen_a, seen_b = [], set(), set()
        for (a, b), _ in sorted(gap.items(), key=lambda kv: (kv[1][0] > MATCH_RTOL, not kv[1][1], kv[1][0])):
            if a not in seen_a and b not in seen_b:
                best.append((a, b))
                seen_a.add(a)
                seen_b.add(b)
    out = {}
    for a, b in best:
        for i in tg[a]:
            out[i] = i if i in pg[b] else pg[b][0]
    return out
