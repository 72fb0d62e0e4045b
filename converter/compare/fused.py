"""One paddle layer computing what several torch layers compute.

A fused q|k|v projection (PaddleNLP QWen's `c_attn`, a `qkv_proj`) or a fused gate|up
Linear holds the weights of several torch modules, merged by the mapping along one axis.
Its output is then those modules' outputs side by side, in the plan's order, along the
output axis where its size is the sum of theirs (or, where it returns one output per module,
those outputs in that order). Each torch module is paired with its own slice of that output
and judged against its own budget; the layout is never a difference. A fused layer whose
output cannot be cut so is paired with none of them: it is judged within its parent.
"""

from __future__ import annotations

from dataclasses import dataclass

from .matching import same_values
from ..paths import parent


@dataclass(frozen=True)
class Slice:
    """The part of a fused paddle layer's output that one torch module computes."""

    axis: int  # counted from the end of paddle's output shape (-1: the last axis)
    start: int
    stop: int
    modules: tuple  # the torch modules the layer fuses, in the plan's order
    output: int | None = None  # where the layer returns one output per module: this module's

    def take(self, value):
        """This slice of a paddle tensor or numpy array."""
        return value[(Ellipsis, slice(self.start, self.stop)) + (slice(None),) * (-1 - self.axis)]

    @property
    def note(self) -> str:
        merges = f"the mapping merges {', '.join(self.modules)} into this layer, in that order"
        if self.output is not None:
            return f"output {self.output} of paddle's fused layer ({merges})"
        axis = "last axis" if self.axis == -1 else f"axis {self.axis}"
        return f"elements {self.start}:{self.stop} of paddle's fused output along its {axis} ({merges})"


def sliced(pair, outputs: list) -> list:
    """A pair's paddle outputs as its torch module computes them: its slice where the paddle layer
    is fused, else as they are."""
    part = getattr(pair, "part", None)
    if part is None or not outputs:
        return outputs
    if part.output is not None:
        return outputs[part.output:part.output + 1]
    return [part.take(outputs[0])]


def merged_modules(plan) -> dict[str, tuple]:
    """paddle layer path -> the torch modules whose weights the plan merges into it, in its order:
    where every tensor of the layer is a merge of whole tensors (no reshape, no split: a per-head
    interleave is not a concatenation of outputs) of the same two or more modules, in one order."""
    by_layer: dict[str, list] = {}
    for entry in plan.entries if plan is not None else ():
        by_layer.setdefault(parent(entry.name), []).append(entry)
    out = {}
    for layer, entries in by_layer.items():
        orders = set()
        for entry in entries:
            if entry.merge_axis is None or any(p.reshape is not None or p.piece is not None for p in entry.parts):
                break
            orders.add(tuple(parent(p.source) for p in entry.parts))
        else:
            if len(orders) == 1:
                modules = orders.pop()
                if len(modules) >= 2 and len(set(modules)) == len(modules):
                    out[layer] = modules
    return out


def _axis(t_shapes: list, p_shape: tuple) -> int | None:
    """The axis (from the end) along which paddle's output is the torch outputs side by side:
    every other axis as torch's, this one the sum of theirs."""
    n = len(p_shape)
    if any(len(s) != n for s in t_shapes):
        return None
    for a in range(n - 1, -1, -1):
        others = [tuple(s[:a]) + tuple(s[a + 1:]) for s in t_shapes]
        if all(o == tuple(p_shape[:a]) + tuple(p_shape[a + 1:]) for o in others) \
                and sum(s[a] for s in t_shapes) == p_shape[a]:
            return a - n
    return None


def _same_input(t_calls: list) -> bool:
    """Whether the torch modules received the same first input (where inputs were recorded): a
    fused layer takes one input for all of them."""
    from ..frameworks import torch_side
    from .capture import call_tensors
    firsts = [call_tensors(c.args, c.kwargs, torch_side.is_tensor) for c in t_calls]
    if any(not f for f in firsts):
        return all(not f for f in firsts)  # an outline: shapes are all there is
    x = torch_side.to_numpy(firsts[0][0])
    return all(f[0] is firsts[0][0] or same_values(torch_side.to_numpy(f[0]), x) == 0.0 for f in firsts[1:])


def fused_slices(torch_calls: dict, paddle_calls: dict, plan) -> dict[str, tuple[str, Slice]]:
    """torch module path -> (fused paddle layer path, its slice), for every paddle layer the plan
    fuses from several torch modules whose calls fit: one floating output each, the same input
    to all of them, and paddle's output their outputs side by side along one axis, or one output
    per module, each of its module's shape."""
    out = {}
    for layer, modules in merged_modules(plan).items():
        p_call = paddle_calls.get(layer)
        t_calls = [torch_calls.get(m) for m in modules]
        if p_call is None or any(c is None for c in t_calls) or any(len(c.shapes) != 1 for c in t_calls) \
                or not _same_input(t_calls):
            continue
        t_shapes = [tuple(c.shapes[0]) for c in t_calls]
        p_shapes = [tuple(s) for s in p_call.shapes]
        if p_shapes == t_shapes:
            out.update((m, (layer, Slice(-1, 0, s[-1] if s else 0, modules, i))) for i, (m, s) in
                       enumerate(zip(modules, t_shapes)))
            continue
        axis = _axis(t_shapes, p_shapes[0]) if len(p_shapes) == 1 else None
        if axis is None:
            continue
        start = 0
        for module, shape in zip(modules, t_shapes):
            out[module] = (layer, Slice(axis, start, start + shape[axis], modules))
            start += shape[axis]
    return out
