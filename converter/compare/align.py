"""Pair torch module paths with paddle layer paths.

In order of trust: the same path on both sides; the mapping (the paddle layers
that receive a torch module's weights, up to their common ancestor; a paddle layer
fusing several torch modules' weights pairs with each of them, by its slice of the
output: see fused.py); and for
layers without weights, the same kind of layer in execution order under the
same paired parent. A module called more than once gives a call each (capture.call_key): a shared
layer's k-th call pairs as a layer of its own would, with the module that runs at that place on the
other side (by kind and execution order, or, for a module paired by its weights, its partner's k-th
call). A layer that exists on one side only stays unpaired and is compared at its nearest paired
ancestor.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..families import OutputReading, kind_of, lookup
from .capture import call_key, is_first_call
from .fused import fused_slices
from .matching import common_shape, same_values
from ..paths import common_parent, is_under, parent


@dataclass(frozen=True)
class LayerPair:
    torch: str
    paddle: str
    torch_type: str
    paddle_type: str
    # how the paddle layer's outputs read as the torch module's: its slice of a fused layer's output
    # (see fused.py), or its family's reading (a gate's logits as a router's softmax and top-k)
    part: OutputReading | None = None


def nearest_in(path: str, paths) -> str | None:
    """The nearest proper ancestor of `path` that is in `paths`, or None."""
    while path:
        path = parent(path)
        if path in paths:
            return path
    return None


def _weight_routes(plan) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """From the mapping plan (literal and pattern rules alike, as applied to the real keys): torch
    module path -> paddle layer paths that receive its weights, and paddle layer path -> torch
    module paths whose weights it receives."""
    targets: dict[str, set[str]] = {}
    sources: dict[str, set[str]] = {}
    for entry in plan.entries if plan is not None else ():
        for part in entry.parts:
            targets.setdefault(parent(part.source), set()).add(parent(entry.name))
            sources.setdefault(parent(entry.name), set()).add(parent(part.source))
    return targets, sources


def shapes_fit(t_call, p_call) -> bool:
    """Whether two calls' outputs can be the same values: as many, each pair broadcast-compatible."""
    a, b = t_call.shapes, p_call.shapes
    return len(a) == len(b) and all(common_shape(x, y) is not None for x, y in zip(a, b))


def _fitting_holder(p: str, t_call, paddle_calls: dict, used: set, targets: set[str], receiving: set[str]) -> str:
    """Of `p` and its ancestors that hold exactly the same weights, the innermost whose outputs can
    be the torch call's values (paddle.vision's transition layer pools in the block around the
    layer that holds the norm and the convolution, torchvision's in the module that holds them);
    `p` where none can."""
    holder = p
    while holder:
        call = paddle_calls.get(holder)
        if call is not None and holder not in used and shapes_fit(t_call, call):
            return holder
        holder = parent(holder)
        if not _holds_exactly(holder, targets, receiving):
            break
    return p


def _holds_exactly(p: str, targets: set[str], receiving: set[str]) -> bool:
    """Whether the paddle layers under `p` that receive torch weights are exactly `targets`."""
    return {x for x in receiving if is_under(x, p)} == targets


def _calls_fit(t_call, p_call, as_many: bool = False) -> bool:
    """Whether two calls of layers without weights can be the same step: (where the inputs were
    recorded) the first input of each holding the same values (two dropouts of one shape, one after
    the attention and one after the MLP, are told apart by what they receive) and as many outputs;
    in an outline, as many outputs, each pair broadcast-compatible, or (`as_many`: both sides have as
    many such layers under the parent) of other sizes (see _sized_apart)."""
    from ..frameworks import paddle_side, torch_side
    from .replay import paddle_inputs, torch_inputs
    x, y = torch_inputs(t_call), paddle_inputs(p_call)
    if not x or not y:  # an outline: shapes are all there is, and the order where both sides have as many
        return shapes_fit(t_call, p_call) or (as_many and _sized_apart(t_call, p_call))
    if same_values(paddle_side.to_numpy(y[0]), torch_side.to_numpy(x[0])) is None:
        return False
    # the same values in: the same step, even where its outputs hold other counts of elements (a
    # MaxPool with ceil_mode on one side only): then it is the first layer whose output is wrong
    return shapes_fit(t_call, p_call) or _sized_apart(t_call, p_call)


def _sized_apart(t_call, p_call) -> bool:
    """As many outputs, and one of them of another count of elements: one step computing a result of
    another size, not the same values laid out otherwise (HF Bloom drops out [B, H, T, T] where
    PaddleNLP has [B*H, T, T] or other layouts: those are left to their parent)."""
    return len(t_call.shapes) == len(p_call.shapes) and any(
        math.prod(a) != math.prod(b) for a, b in zip(t_call.shapes, p_call.shapes))


PAIR = 1 << 20  # a pair's weight in in_order: any number of pairs outweighs every bonus


def in_order(a: list, b: list, fits, bonus=lambda x, y: 0) -> list[tuple]:
    """The longest sequence of pairs (a[i], b[j]) that fit, keeping both orders (a longest common
    subsequence): layers without weights pair in execution order, and where one side has a layer
    more (paddle's attention applies dropout as a function, torch's as a module), the pairs
    whose outputs cannot be the same values are skipped rather than forced. Of sequences as long,
    the one whose pairs earn the most `bonus(a[i], b[j])` (small integers)."""
    n, m = len(a), len(b)
    weight = [[PAIR + bonus(x, y) if fits(x, y) else 0 for y in b] for x in a]
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            paired = best[i + 1][j + 1] + weight[i][j] if weight[i][j] else 0
            best[i][j] = max(best[i + 1][j], best[i][j + 1], paired)
    out, i, j = [], 0, 0
    while i < n and j < m:
        if weight[i][j] and best[i][j] == best[i + 1][j + 1] + weight[i][j]:
            out.append((a[i], b[j]))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def _anchors(calls: dict, paired):
    """For a call, the path of the last paired call that completed before it started (None where
    none did): layers without weights between the same paired layers on both sides are the same
    step (a ReLU after conv5, where paddle applies the one after conv4 as a function)."""
    done = sorted((calls[path].end, path) for path in paired if path in calls)
    ends = [end for end, _ in done]
    return lambda call: done[k - 1][1] if (k := bisect.bisect_left(ends, call.start)) else None


def align(torch_calls: dict, paddle_calls: dict, plan=None) -> list[LayerPair]:
    """Pairs in torch completion order. `*_calls` map path -> Call (with .type and .end)."""
    pairs: dict[str, str] = {}
    used: set[str] = set()

    def add(t, p):
        if t not in pairs and p not in used and p in paddle_calls:
            pairs[t] = p
            used.add(p)

    # a paddle layer that fuses several torch modules (q|k|v, gate|up): each module with its slice
    fused = fused_slices(torch_calls, paddle_calls, plan)
    pairs.update((t, p) for t, (p, _) in fused.items())
    used.update(p for p, _ in fused.values())
    own, sources = _weight_routes(plan)
    holds_weights = lambda t: any(is_under(module, t) for module in own)
    # weights first: a torch module pairs with a paddle layer when the weights of the two subtrees
    # are exactly the same ones under the mapping, both ways (a fused q|k|v layer that could not be
    # cut into slices holds more than q_proj's). Where several torch modules fit one paddle layer
    # (a wrapper around a Linear, torch's BertPooler against paddle's bare Linear that a rule maps
    # `pooler.dense` onto), the one of the same kind wins, then the one of the same name, then the
    # innermost: the mapping decides before names do.
    receiving = set().union(*own.values())
    candidates: dict[str, list[str]] = {}
    for t in torch_calls:
        if t in pairs:
            continue
        targets = set().union(*(paths for module, paths in own.items() if is_under(module, t)))
        if not targets:
            continue
        p = common_parent(sorted(targets))
        p = t if t in paddle_calls and t not in used and is_under(p, t) and _holds_exactly(t, targets, receiving) else p
        p = _fitting_holder(p, torch_calls[t], paddle_calls, used, targets, receiving)
        if p in paddle_calls and p not in used and _holds_exactly(p, targets, receiving) \
                and all(is_under(m, t) for x in targets for m in sources.get(x, ())):
            candidates.setdefault(p, []).append(t)
    for p, ts in candidates.items():
        same_kind = lambda t: kind_of(torch_calls[t].type) == kind_of(paddle_calls[p].type)
        add(max(ts, key=lambda t: (same_kind(t), t == p, t.count("."))), p)
    for path in torch_calls:
        # then the same path, unless the two are layers without weights whose outputs cannot be the
        # same values (HF Bloom drops out [B, H, T, T], PaddleNLP [B*H, T, T]): those are left
        # to their parent rather than failed for a shape
        if path in paddle_calls and (holds_weights(path) or shapes_fit(torch_calls[path], paddle_calls[path])):
            add(path, path)
    _later_calls(torch_calls, paddle_calls, pairs, fused, add)
    # layers without weights: same family, execution order, under the same paired ancestor
    groups_t: dict[tuple, list[str]] = {}
    groups_p: dict[tuple, list[str]] = {}
    for t, call in sorted(torch_calls.items(), key=lambda kv: kv[1].end):
        if t not in pairs:
            groups_t.setdefault((pairs.get(nearest_in(t, pairs)), kind_of(call.type)), []).append(t)
    for p, call in sorted(paddle_calls.items(), key=lambda kv: kv[1].end):
        if p not in used:
            groups_p.setdefault((nearest_in(p, used), kind_of(call.type)), []).append(p)
    partner = {p: t for t, p in pairs.items()}
    anchor_t, anchor_p = _anchors(torch_calls, pairs), _anchors(paddle_calls, partner)
    same_anchor = lambda t, p: int(anchor_t(torch_calls[t]) == partner.get(anchor_p(paddle_calls[p])))
    for key, t_list in groups_t.items():
        p_list = groups_p.get(key, [])
        if key[0] is not None:
            as_many = len(t_list) == len(p_list)
            for t, p in in_order(t_list, p_list, lambda t, p: _calls_fit(torch_calls[t], paddle_calls[p], as_many),
                                 same_anchor):
                add(t, p)
    ordered = sorted(pairs.items(), key=lambda kv: torch_calls[kv[0]].end)
    return [LayerPair(t, p, torch_calls[t].type, paddle_calls[p].type,
                      fused[t][1] if t in fused else _reading(torch_calls[t], paddle_calls[p]))
            for t, p in ordered]


def _later_calls(torch_calls: dict, paddle_calls: dict, pairs: dict, fused: dict, add) -> None:
    """A module paired by its weights or its path that both sides call more than once (a block
    shared between places, as ALBERT's layer): its k-th call with its partner's k-th call (see
    capture.call_key), where their outputs can be the same values."""
    for t, p in list(pairs.items()):
        if t in fused or not is_first_call(t) or not is_first_call(p):
            continue
        for k in range(2, min(torch_calls[t].count, paddle_calls[p].count) + 1):
            tk, pk = call_key(t, k), call_key(p, k)
            if tk in torch_calls and pk in paddle_calls and shapes_fit(torch_calls[tk], paddle_calls[pk]):
                add(tk, pk)


def _reading(t_call, p_call):
    """How the paddle layer's outputs read as the torch module's where their family says (a gate's
    logits as a router's softmax and top-k weights); None where they compare as they are."""
    if t_call.module is None or p_call.module is None:
        return None
    family = lookup(t_call.module, p_call.module)
    return family.reads(t_call.module, p_call.module) if family is not None and family.reads is not None else None
