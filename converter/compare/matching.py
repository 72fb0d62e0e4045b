"""Which paddle input is which torch input: by value, never by position or name alone.

Two ports of one model rarely call a layer the same way. Attention takes `hidden_states`
on one side and `(query, key, value)` on the other (the same tensor three times); position
ids are a `[1, T]` row on one side and `[B, T]` on the other; a mask is `[B, 1, 1, T]`
additive on one side, `[B, 1, T, T]` on the other, a keep-mask of 1s and 0s, or absent; a block
runs sequence-first (`[T, B, C]`) on one side and batch-first on the other. So each paddle input
is paired with the torch input that holds the same values after broadcasting:

* SAME      the paddle tensor is a copy of this torch input already (handed on);
* VALUE     the same values up to broadcasting (exactly, for integers and booleans;
            within MATCH_RTOL of the tensor's largest magnitude for floats, since the
            enclosing code computed it with its own rounding), or with the axes in another
            order (`axes`: the order of torch's axes that lays it out as paddle's);
* JOINED    the torch inputs source..source+count-1, joined along `axis` (torchvision's DenseNet
            hands each layer the list of features so far, paddle.vision's their concatenation);
* MASK      both are attention masks that mask the same positions, in other forms (keep 1/0,
            additive, boolean; other shapes): torch's is handed over in paddle's form (masks.py);
* POSITION  left over on both sides, of the same kind and broadcast-compatible shapes (or shapes
            one order of the axes makes alike), in order: the same argument, computed differently
            by the enclosing code (its own error, which the boundary check charges to it);
* NONE      no counterpart (a mask torch does not take, a table computed inside): left as
            paddle computed it.

A match only says which is which; whether the values agree within budget is judged
elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .masks import (MASKED_BELOW as MASKED_BELOW, is_causal as is_causal, masked_alike as masked_alike,
                    masked_by_torch as masked_by_torch, masked_positions, same_mask)
from .outputs import OutputPairs as OutputPairs, pair_outputs as pair_outputs
from .shapes import (MATCH_RTOL as MATCH_RTOL, common_shape, distance, fit, kind, lay_out as lay_out,
                     merged_shape as merged_shape, orders_to, same_values)

SAME, VALUE, JOINED, MASK, POSITION, NONE = "same", "value", "joined", "mask", "position", "none"


@dataclass(frozen=True)
class InputMatch:
    index: int  # among the call tensors of the side being forced (paddle's, in a forced paddle pass)
    source: int | None  # among the other side's call tensors: the one it takes the values of
    how: str
    count: int = 1  # JOINED: how many of the other side's tensors, from `source` on
    axis: int = 0  # JOINED: the axis they are joined along
    axes: tuple | None = None  # SAME, VALUE, POSITION: the order of the source's axes that gives this input's


def in_layout(array: np.ndarray, match: InputMatch) -> np.ndarray:
    """The source's array laid out with its axes in the match's order (as it is where it has none)."""
    return array if match.axes is None else np.transpose(array, match.axes)


def match_inputs(paddle_values: list, torch_values: list, same: dict | None = None) -> list[InputMatch]:
    """One InputMatch per paddle input. `paddle_values` and `torch_values` are numpy arrays
    (a paddle entry may be a callable giving its array, asked for only when needed); `same`
    maps paddle indices that are copies of a torch input to that input's index, or to (index,
    order of its axes) for a copy with its axes in another order."""
    matches: dict[int, InputMatch] = {}
    for j, found in (same or {}).items():
        i, axes = found if isinstance(found, tuple) else (found, None)
        matches[j] = InputMatch(j, i, SAME, axes=axes)
    arrays: dict[int, np.ndarray] = {}

    def paddle_array(j):
        if j not in arrays:
            v = paddle_values[j]
            arrays[j] = v() if callable(v) else v
        return arrays[j]

    unmatched = lambda: [j for j in range(len(paddle_values)) if j not in matches]
    for j in unmatched():
        a = paddle_array(j)
        best = None
        for i, t in enumerate(torch_values):
            key = (same_values(a, t), tuple(t.shape) != tuple(a.shape))
            if key[0] is not None and (best is None or key < best[0]):
                best = (key, i)
                if best[0] == (0.0, False):
                    break  # the same values in the same shape: none can be nearer
        if best is not None:
            matches[j] = InputMatch(j, best[1], VALUE)
            continue
        permuted = _permuted(a, torch_values, range(len(torch_values)))
        if permuted is not None and permuted[2] is not None:
            matches[j] = InputMatch(j, permuted[0], VALUE, axes=permuted[1])
    taken = {m.source for m in matches.values()}
    for j in unmatched() if len(torch_values) > 1 else ():
        joined = _joined_run(paddle_array(j), torch_values, taken)
        if joined is not None:
            matches[j] = InputMatch(j, joined[0], JOINED, joined[1], joined[2])
            taken.update(range(joined[0], joined[0] + joined[1]))
    for j in unmatched():
        i = next((i for i, t in enumerate(torch_values) if i not in taken and same_mask(paddle_array(j), t)), None)
        if i is not None:
            matches[j] = InputMatch(j, i, MASK)
            taken.add(i)
    left = [i for i in range(len(torch_values)) if i not in taken]
    for j in unmatched():
        a = paddle_array(j)
        plain = lambda t, a=a: kind(t) == kind(a) and masked_positions(a) is None and masked_positions(t) is None
        i = next((i for i in left if plain(torch_values[i]) and _stands_for(torch_values[i], a)), None)
        axes = None
        if i is None:  # the same argument with its axes in another order ([T, B, C] against [B, T, C])
            permuted = _permuted(a, torch_values, [i for i in left if plain(torch_values[i])])
            i, axes = permuted[:2] if permuted is not None else (None, None)
        if i is not None:
            left.remove(i)
        matches[j] = InputMatch(j, i, NONE if i is None else POSITION, axes=axes)
    return [matches[j] for j in range(len(paddle_values))]


def _permuted(a: np.ndarray, torch_values: list, among) -> tuple | None:
    """(torch index, order of its axes, gap) for the torch input among `among` that, with its axes
    in another order, is laid out as `a`: the first whose values are then `a`'s (gap: see
    same_values), else the first such shape nearest in value (gap None); None where no shape fits."""
    nearest = None
    for i in among:
        t = torch_values[i]
        if kind(t) != kind(a) or t.ndim < 2:
            continue
        for order in orders_to(t.shape, a.shape):
            laid = np.transpose(t, order)
            gap = same_values(a, laid)
            if gap is not None:
                return i, order, gap
            d = distance(a, laid)
            if nearest is None or d < nearest[2]:
                nearest = (i, order, d)
    return None if nearest is None else (nearest[0], nearest[1], None)


MAX_JOINED = 256  # torch inputs tried as one joined paddle input


def _joined_run(a: np.ndarray, torch_values: list, taken: set) -> tuple | None:
    """(first, count, axis): a run of two or more torch inputs, none taken yet, that joined along one
    axis hold `a`'s values (see same_values); None where none does."""
    if a.ndim == 0 or kind(a) != "f":
        return None
    for first in range(len(torch_values)):
        for axis in range(a.ndim):
            size, last = 0, first
            while last < min(len(torch_values), first + MAX_JOINED) and last not in taken:
                t = torch_values[last]
                if t.ndim != a.ndim or kind(t) != "f" or \
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
            parts.append(f"input {m.index} [{shape}] is a mask in another form (same positions): given torch's in "
                         "this form")
        elif m.axes is not None:
            parts.append(f"input {m.index} [{shape}] is torch's input {m.source} with its axes in the order "
                         f"{list(m.axes)}: given it so")
        elif m.how == JOINED:
            parts.append(f"input {m.index} [{shape}] is torch's inputs {m.source} to {m.source + m.count - 1} joined "
                         f"along axis {m.axis}: given them joined")
        elif m.how == NONE:
            parts.append(f"input {m.index} [{shape}] has no counterpart on the other side: left as computed")
    return "; ".join(parts)
