"""Which paddle input is which torch input: by value, never by position or name alone.

Two ports of one model rarely call a layer the same way. Attention takes `hidden_states`
on one side and `(query, key, value)` on the other (the same tensor three times); position
ids are a `[1, T]` row on one side and `[B, T]` on the other; a mask is `[B, 1, 1, T]`
additive on one side, `[B, 1, T, T]` on the other, or absent. So each paddle input is
paired with the torch input that holds the same values after broadcasting:

* SAME      the paddle tensor is a copy of this torch input already (handed on);
* VALUE     the same values up to broadcasting (exactly, for integers and booleans;
            within MATCH_RTOL of the tensor's largest magnitude for floats, since the
            enclosing code computed it with its own rounding);
* JOINED    the torch inputs source..source+count-1, joined along `axis` (torchvision's DenseNet
            hands each layer the list of features so far, paddle.vision's their concatenation);
* MASK      both are attention masks that mask the same positions, in other conventions
            (additive or boolean, other shapes): paddle's is kept as it is;
* POSITION  left over on both sides, of the same kind and broadcast-compatible shapes, in
            order: the same argument, computed differently by the enclosing code (its own
            error, which the boundary check charges to it);
* NONE      no counterpart (a mask torch does not take, a table computed inside): left as
            paddle computed it.

A match only says which is which; whether the values agree within budget is judged
elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np

SAME, VALUE, JOINED, MASK, POSITION, NONE = "same", "value", "joined", "mask", "position", "none"
MATCH_RTOL = 5e-2
MASKED_BELOW = -1e3  # an additive mask value at or below this masks its position


def masked_by_torch(y_t: np.ndarray, y64: np.ndarray) -> np.ndarray:
    """Positions torch's fp32 run fills with a mask value and its float64 run with one float32
    cannot hold (float64's lowest, where HF takes finfo(dtype).min): their difference is no drift
    but two mask values, and the other side is judged there as against torch's fp32 value."""
    with np.errstate(invalid="ignore"):
        return (y_t <= MASKED_BELOW) & ~(y64 >= -float(np.finfo(np.float32).max))


@dataclass(frozen=True)
class InputMatch:
    index: int  # among the call tensors of the side being forced (paddle's, in a forced paddle pass)
    source: int | None  # among the other side's call tensors: the one it takes the values of
    how: str
    count: int = 1  # JOINED: how many of the other side's tensors, from `source` on
    axis: int = 0  # JOINED: the axis they are joined along


def common_shape(a: tuple, b: tuple) -> tuple | None:
    """The shape both are compared in: where they hold as many elements in the same order and
    differ only in axes of size 1 ([B, C, 1, 1] against [B, C]), the one of fewer axes, never the
    grid broadcasting would make of them; else the one both broadcast to, else the one that merges
    the other's leading axes (see merged_shape); None when there is none."""
    squeezed = _squeezed_alike(tuple(a), tuple(b))
    if squeezed is not None:
        return squeezed
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return merged_shape(tuple(a), tuple(b))


def _squeezed_alike(a: tuple, b: tuple) -> tuple | None:
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
                                           or _squeezed_alike(tuple(array.shape), shape) is not None):
        return array.reshape(shape)
    return np.broadcast_to(array, shape)


def _laid_out_alike(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays numpy can broadcast against each other: as they are, or the one whose leading
    axes the other merges reshaped to match."""
    merged = _squeezed_alike(tuple(a.shape), tuple(b.shape)) or merged_shape(tuple(a.shape), tuple(b.shape))
    if merged is None or a.size != b.size:
        return a, b
    return a.reshape(merged), b.reshape(merged)


def _kind(a: np.ndarray) -> str:
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
    if _kind(a) != _kind(b) or common_shape(a.shape, b.shape) is None:
        return None
    if a.size == 0 or b.size == 0:
        return 0.0 if a.size == b.size else None
    a, b = _laid_out_alike(a, b)
    if _kind(a) != "f":
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


def masked_positions(a: np.ndarray, flip: bool = False) -> np.ndarray | None:
    """The positions a mask masks (True), or None when `a` is not mask-like: a boolean tensor
    (True keeps a position, or masks it when `flip`), or an additive float tensor whose values
    are all 0 or far below 0."""
    if a.dtype == np.bool_:
        return a if flip else ~a
    if not np.issubdtype(a.dtype, np.floating) or a.ndim < 2:
        return None
    with np.errstate(invalid="ignore"):
        masked = a <= MASKED_BELOW
        if not np.all(masked | (a == 0)) or not masked.any():
            return None
    return masked


def _key_window(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two masks cut to the key positions both have: HF sizes its causal mask for the cache
    (one key more than the queries) and slices it to the keys in use."""
    if a.ndim == b.ndim and a.ndim >= 2 and a.shape[-1] != b.shape[-1] and min(a.shape[-1], b.shape[-1]) > 1:
        n = min(a.shape[-1], b.shape[-1])
        return a[..., :n], b[..., :n]
    return a, b


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


def same_mask(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two masks (either convention, broadcast-compatible shapes) mask the same positions."""
    a, b = _key_window(a, b)
    if common_shape(a.shape, b.shape) is None:
        return False
    mb = masked_positions(b)
    if mb is None:
        return False
    for flip in (False, True) if a.dtype == np.bool_ else (False,):
        ma = masked_positions(a, flip)
        if ma is not None and np.array_equal(*np.broadcast_arrays(*_laid_out_alike(ma, mb))):
            return True
    return False


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


def match_inputs(paddle_values: list, torch_values: list, same: dict[int, int] | None = None) -> list[InputMatch]:
    """One InputMatch per paddle input. `paddle_values` and `torch_values` are numpy arrays
    (a paddle entry may be a callable giving its array, asked for only when needed); `same`
    maps paddle indices that are copies of a torch input to that input's index."""
    same = same or {}
    matches: dict[int, InputMatch] = {j: InputMatch(j, i, SAME) for j, i in same.items()}
    arrays: dict[int, np.ndarray] = {}

    def paddle_array(j):
        if j not in arrays:
            v = paddle_values[j]
            arrays[j] = v() if callable(v) else v
        return arrays[j]

    for j in range(len(paddle_values)):
        if j in matches:
            continue
        a = paddle_array(j)
        best = None
        for i, t in enumerate(torch_values):
            gap = same_values(a, t)
            if gap is not None and (best is None or (gap, tuple(t.shape) != tuple(a.shape)) < best[0]):
                best = ((gap, tuple(t.shape) != tuple(a.shape)), i)
                if best[0] == (0.0, False):
                    break  # the same values in the same shape: none can be nearer
        if best is not None:
            matches[j] = InputMatch(j, best[1], VALUE)
    taken = {m.source for m in matches.values()}
    for j in range(len(paddle_values)):
        if j not in matches and len(torch_values) > 1:
            joined = _joined_run(paddle_array(j), torch_values, taken)
            if joined is not None:
                matches[j] = InputMatch(j, joined[0], JOINED, joined[1], joined[2])
                taken.update(range(joined[0], joined[0] + joined[1]))
    for j in range(len(paddle_values)):
        if j in matches:
            continue
        i = next((i for i, t in enumerate(torch_values) if i not in taken and same_mask(paddle_array(j), t)), None)
        if i is not None:
            matches[j] = InputMatch(j, i, MASK)
            taken.add(i)
    left = [i for i in range(len(torch_values)) if i not in taken]
    for j in range(len(paddle_values)):
        if j in matches:
            continue
        a = paddle_array(j)
        i = next((i for i in left if _kind(torch_values[i]) == _kind(a)
                  and masked_positions(a) is None and masked_positions(torch_values[i]) is None
                  and _stands_for(torch_values[i], a)), None)
        if i is not None:
            left.remove(i)
        matches[j] = InputMatch(j, i, NONE if i is None else POSITION)
    return [matches[j] for j in range(len(paddle_values))]


MAX_JOINED = 256  # torch inputs tried as one joined paddle input


def _joined_run(a: np.ndarray, torch_values: list, taken: set) -> tuple | None:
    """(first, count, axis): a run of two or more torch inputs, none taken yet, that joined along one
    axis hold `a`'s values (see same_values); None where none does."""
    if a.ndim == 0 or _kind(a) != "f":
        return None
    for first in range(len(torch_values)):
        for axis in range(a.ndim):
            size, last = 0, first
            while last < min(len(torch_values), first + MAX_JOINED) and last not in taken:
                t = torch_values[last]
                if t.ndim != a.ndim or _kind(t) != "f" or \
                        any(t.shape[k] != a.shape[k] for k in range(a.ndim) if k != axis):
                    break
                size += t.shape[axis]
                last += 1
                if size >= a.shape[axis]:
                    break
            if last - first >= 2 and size == a.shape[axis] and \
                    same_values(np.concatenate(torch_values[first:last], axis=axis), a) is not None:
                return first, last - first, axis
    return None


def joined(arrays: list, match: InputMatch) -> np.ndarray:
    """The torch arrays a JOINED match takes, joined."""
    return np.concatenate(arrays[match.source:match.source + match.count], axis=match.axis)


def _stands_for(t: np.ndarray, a: np.ndarray) -> bool:
    """Whether torch's `t`, broadcast, can stand for paddle's `a`: their shapes broadcast together,
    and along the axes where `t` has 1 and `a` more, `a` repeats one slice (a batch broadcast). A
    paddle tensor holding several things there (cos and sin stacked, where torch passes cos and sin
    apart) is no one torch input, whatever its shape."""
    if common_shape(a.shape, t.shape) is None:
        return False
    if a.ndim < t.ndim:
        return True
    aligned = (1,) * (a.ndim - t.ndim) + tuple(t.shape)
    return fit(a, tuple(1 if n == 1 else m for n, m in zip(aligned, a.shape))) is not None


def describe(matches: list[InputMatch], shapes: list[tuple]) -> str:
    """A row's note on the inputs that were not taken from torch, or ""."""
    parts = []
    for m in matches:
        shape = "x".join(map(str, shapes[m.index])) or "scalar"
        if m.how == MASK:
            parts.append(f"input {m.index} [{shape}] is a mask in another convention (same positions): kept as it was")
        elif m.how == JOINED:
            parts.append(f"input {m.index} [{shape}] is torch's inputs {m.source} to {m.source + m.count - 1} joined "
                         f"along axis {m.axis}: given them joined")
        elif m.how == NONE:
            parts.append(f"input {m.index} [{shape}] has no counterpart on the other side: left as computed")
    return "; ".join(parts)


@dataclass(frozen=True)
class OutputPairs:
    """Which output of each side is compared with which, and in what shape: by position when both
    sides give as many and every pair broadcasts; else each torch output with the paddle output
    nearest in value (PaddleNLP's DeBERTa encoder returns its input and every hidden state
    where HF's returns the last one)."""

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
        return [_in_span(_in_order(items[j], order, shape), span, shape)
                for j, order, span, shape in zip(self.paddle, self.orders(), self.cuts(), self.shapes)]

    def fits(self, paddle_items: list) -> bool:
        """Whether another set of paddle outputs (a forced run's) can stand where these were."""
        return all(j < len(paddle_items)
                   and common_shape(tuple(_in_span(_in_order(paddle_items[j], order, s), span, s).shape), s) == s
                   for j, order, span, s in zip(self.paddle, self.orders(), self.cuts(), self.shapes))

    def orders(self) -> tuple:
        """Per pair, the order of paddle's axes (None: as it is)."""
        return self.axes or (None,) * len(self.paddle)

    def cuts(self) -> tuple:
        """Per pair, the span of paddle's output compared (None: all of it)."""
        return self.spans or (None,) * len(self.paddle)


MAX_AXES_PERMUTED = 5  # outputs of up to this many axes are tried in every order of their axes


def _axes_order(t: np.ndarray, p: np.ndarray) -> tuple | None:
    """The order of p's axes (other than as it is) that lays p out as t, chosen by value among the
    orders that give t's shape, where those values are then the same ones (see same_values); None
    when no order does."""
    import itertools
    if t.ndim != p.ndim or t.ndim > MAX_AXES_PERMUTED or sorted(t.shape) != sorted(p.shape) or t.shape == p.shape:
        return None
    fits = [order for order in itertools.permutations(range(p.ndim))
            if tuple(p.shape[k] for k in order) == t.shape]
    gaps = {order: same_values(np.transpose(p, order), t) for order in fits}
    found = {order: d for order, d in gaps.items() if d is not None}
    return min(found, key=found.get) if found else None


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


def _in_order(item, order: tuple | None, shape: tuple):
    """`item` (numpy or paddle) with its axes in `order` where that lays it out as `shape`."""
    if order is None or tuple(item.shape) == tuple(shape) or tuple(item.shape[k] for k in order) != tuple(shape):
        return item
    return np.transpose(item, order) if isinstance(item, np.ndarray) else item.transpose(list(order))


def pair_outputs(t_shapes: list, p_shapes: list, t_values=None, p_values=None) -> OutputPairs:
    """OutputPairs for outputs of these shapes. A single output on each side pairs by position
    when the shapes broadcast; several are paired by value (`*_values()` give the numpy
    arrays): each torch output with the paddle output nearest to it, its own position first
    where that is as near as any. One paddle output may answer for two torch outputs (HF
    returns the last hidden state, and again among all of them)."""
    if len(t_shapes) == 1 and len(p_shapes) == 1 and common_shape(t_shapes[0], p_shapes[0]) is not None:
        return OutputPairs((0,), (0,), (common_shape(t_shapes[0], p_shapes[0]),))
    if len(t_shapes) == 1 and len(p_shapes) == 1 and t_values is not None and p_values is not None:
        order = _axes_order(t_values()[0], p_values()[0])
        if order is not None:
            return OutputPairs((0,), (0,), (tuple(t_shapes[0]),), (order,))
        span = _span_of(t_values()[0], p_values()[0])
        if span is not None:
            return OutputPairs((0,), (0,), (tuple(t_shapes[0]),), (None,), (span,))
    if t_values is None or p_values is None:
        shapes = [common_shape(a, b) for a, b in zip(t_shapes, p_shapes)]
        n = next((k for k, s in enumerate(shapes) if s is None), len(shapes))
        return OutputPairs(tuple(range(n)), tuple(range(n)), tuple(shapes[:n]))
    ts, ps = t_values(), p_values()
    out_t, out_p, out_s = [], [], []
    for i, t in enumerate(ts):
        gaps = {j: distance(p, t) for j, p in enumerate(ps) if common_shape(p.shape, t.shape) is not None}
        if not gaps:
            continue
        best = min(gaps.values())
        j = i if i in gaps and gaps[i] <= best else min(gaps, key=gaps.get)
        if gaps[j] == np.inf and j != i:
            continue
        out_t.append(i)
        out_p.append(j)
        out_s.append(common_shape(t.shape, ps[j].shape))
    return OutputPairs(tuple(out_t), tuple(out_p), tuple(out_s))
