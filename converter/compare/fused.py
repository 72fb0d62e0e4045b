"""One paddle layer computing what several torch layers compute.

A fused q|k|v projection (PaddleNLP QWen's `c_attn`, a `qkv_proj`) or a fused gate|up
Linear holds the weights of several torch modules, merged by the mapping along one axis:
whole tensors side by side, or (a merge by groups: PaddleFormers' q|k|v, per KV group that
group's query heads, then its key head, then its value head) blocks of them in turn. Its
output is then those modules' outputs laid out the same way along the output axis where its
size is the sum of theirs (or, where it returns one output per module, those outputs in that
order). Each torch module is paired with its own positions of that output, in its own order,
and judged against its own budget; the layout is never a difference. A fused layer whose
output cannot be cut so is paired with none of them: it is judged within its parent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..families import OutputReading
from .matching import same_values
from ..paths import parent


@dataclass(frozen=True)
class Slice(OutputReading):
    """The part of a fused paddle layer's output that one torch module computes."""

    axis: int  # counted from the end of paddle's output shape (-1: the last axis)
    start: int  # where the module's elements are one run of positions: start:stop
    stop: int
    modules: tuple  # the torch modules the layer fuses, in the plan's order
    output: int | None = None  # where the layer returns one output per module: this module's
    runs: tuple = ()  # where they are several (a merge by groups): (start, stop) of each, in torch's order

    @property
    def spans(self) -> tuple:
        """(start, stop) of each run of paddle's positions holding this module's elements, in torch's order."""
        return self.runs or ((self.start, self.stop),)

    def of(self, outputs: list) -> list:
        """The module's part of the fused layer's outputs: its own output, or its runs of the one
        output (a paddle tensor or numpy array), joined in torch's order."""
        if self.output is not None:
            return outputs[self.output:self.output + 1]
        value = outputs[0]
        pieces = [value[(Ellipsis, slice(a, b)) + (slice(None),) * (-1 - self.axis)] for a, b in self.spans]
        if len(pieces) == 1:
            return pieces
        if isinstance(value, np.ndarray):
            return [np.concatenate(pieces, axis=self.axis)]
        import paddle
        return [paddle.concat(pieces, axis=self.axis)]

    @property
    def note(self) -> str:
        merges = f"the mapping merges {', '.join(self.modules)} into this layer, in that order"
        if self.output is not None:
            return f"output {self.output} of paddle's fused layer ({merges})"
        axis = "last axis" if self.axis == -1 else f"axis {self.axis}"
        if self.runs:
            merges += f", block by block in {len(self.runs)} groups"
        where = ", ".join(f"{a}:{b}" for a, b in self.spans)
        return f"elements {where} of paddle's fused output along its {axis} ({merges})"


def sliced(pair, outputs: list) -> list:
    """A pair's paddle outputs as its torch module computes them: its slice where the paddle layer
    is fused, its family's reading where it has one (see align.LayerPair.part), else as they are."""
    if pair.part is None or not outputs:
        return outputs
    return pair.part.of(outputs)


def _blocks(entry) -> tuple | None:
    """A merged target's parts along its merge axis, in its order, as (torch module, start, stop):
    the elements of that module's output the part holds (stop None: all of them); None where a
    part is reshaped or cut along another axis (its layer's output is not its modules' side by
    side)."""
    out = []
    for p in entry.parts:
        if p.reshape is not None:
            return None
        axis = p.perm[entry.merge_axis] if p.perm else entry.merge_axis
        if p.piece is None:
            out.append((parent(p.source), 0, None))
        elif p.piece[0] == axis:
            out.append((parent(p.source), p.piece[1], p.piece[2]))
        else:
            return None
    return tuple(out)


def merge_layouts(plan) -> dict[str, tuple]:
    """paddle layer path -> its layout along the merge axis, as (torch module, start, stop) blocks
    in order (see _blocks): where every tensor of the layer is a merge of the same two or more
    modules, laid out alike (a weight and its bias)."""
    by_layer: dict[str, list] = {}
    for entry in plan.entries if plan is not None else ():
        by_layer.setdefault(parent(entry.name), []).append(entry)
    out = {}
    for layer, entries in by_layer.items():
        layouts = {_blocks(e) if e.merge_axis is not None else None for e in entries}
        if len(layouts) != 1:
            continue
        blocks = layouts.pop()
        if blocks is not None and len(_modules(blocks)) >= 2:
            out[layer] = blocks
    return out


def _modules(blocks) -> tuple:
    """The torch modules of a layout, in the order they first appear."""
    return tuple(dict.fromkeys(m for m, _, _ in blocks))


def merged_modules(plan) -> dict[str, tuple]:
    """paddle layer path -> the torch modules whose weights the plan merges into it, in its order."""
    return {layer: _modules(blocks) for layer, blocks in merge_layouts(plan).items()}


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


def _runs(blocks, sizes: dict[str, int]) -> dict[str, tuple] | None:
    """torch module -> the runs of paddle's positions holding its elements, in its own order:
    None unless every element of every module is held exactly once."""
    found: dict[str, list] = {m: [] for m in sizes}
    offset = 0
    for module, start, stop in blocks:
        stop = sizes[module] if stop is None else stop
        if not 0 <= start < stop <= sizes[module]:
            return None
        found[module].append((start, stop, offset))
        offset += stop - start
    out = {}
    for module, pieces in found.items():
        pieces.sort()
        if [a for a, _, _ in pieces] != [0] + [b for _, b, _ in pieces[:-1]] or pieces[-1][1] != sizes[module]:
            return None  # a gap or an overlap in the module's elements
        out[module] = tuple((o, o + b - a) for a, b, o in pieces)
    return out


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
    to all of them, and paddle's output their outputs laid out as the plan lays out their weights
    along one axis, or one output per module, each of its module's shape."""
    out = {}
    for layer, blocks in merge_layouts(plan).items():
        modules = _modules(blocks)
        p_call = paddle_calls.get(layer)
        t_calls = [torch_calls.get(m) for m in modules]
        if p_call is None or any(c is None for c in t_calls) or any(len(c.shapes) != 1 for c in t_calls) \
                or not _same_input(t_calls):
            continue
        t_shapes = [tuple(c.shapes[0]) for c in t_calls]
        p_shapes = [tuple(s) for s in p_call.shapes]
        if p_shapes == t_shapes and len(blocks) == len(modules):
            out.update((m, (layer, Slice(-1, 0, s[-1] if s else 0, modules, i))) for i, (m, s) in
                       enumerate(zip(modules, t_shapes)))
            continue
        axis = _axis(t_shapes, p_shapes[0]) if len(p_shapes) == 1 else None
        runs = None if axis is None else _runs(blocks, {m: s[axis] for m, s in zip(modules, t_shapes)})
        if runs is None:
            continue
        for module in modules:
            spans = runs[module]
            out[module] = (layer, Slice(axis, spans[0][0], spans[-1][1], modules,
                                        runs=spans if len(spans) > 1 else ()))
    return out
