"""The units the binary search probes: the top-level modules of the model (its repeated blocks and
what sits around them), found from the pairs of an outline pass, and the paths they may take,
found from the module tree alone before any pass."""

from __future__ import annotations

import dataclasses

from ..paths import is_inside, parent


def unit_candidates(side, model, blocks: list) -> set[str]:
    """The paths top_level_units may take, from the module tree alone, before any pass: every
    module no deeper than the model's blocks (the children of its largest module lists, see
    widen._blocks), the model itself included; none for a model without blocks. `side` is the
    framework's adapter."""
    ids = {id(b) for b in blocks}
    depth = lambda path: path.count(".") + 1 if path else 0
    named = list(side.named_layers(model))
    deepest = max((depth(path) for path, m in named if id(m) in ids), default=None)
    return set() if deepest is None else {path for path, _ in named if depth(path) <= deepest}


def outline_only(calls: dict) -> dict:
    """Calls as an outline pass records them: order, type and output shapes, no tensors held."""
    return {path: dataclasses.replace(c, args=(), kwargs={}, outputs=[], returned=None) for path, c in calls.items()}


def top_level_units(pairs, t_calls) -> list:
    """Top-level units in execution order: the children of the module list that holds the most
    paired modules (a model's blocks, not the experts inside one block), and the modules that sit
    beside it or beside its ancestors, or inside a container beside them that is never called itself
    (ConvNeXt's downsample_layers[i], run between its stages[i])."""
    paths = [p.torch for p in pairs]
    children: dict[str, list[str]] = {}
    for p in paths:
        if p:
            children.setdefault(parent(p), []).append(p)
    listlike = lambda c: all(child.rsplit(".", 1)[-1].isdigit() for child in children[c])
    held = lambda c: sum(is_inside(p, c) for p in paths)
    container = max(children, key=lambda c: (listlike(c), held(c), -c.count(".")), default="")
    ancestors = [""]
    if container:
        parts = container.split(".")
        ancestors += [".".join(parts[: i + 1]) for i in range(len(parts))]
    def beside(p: str) -> bool:  # its parent is an ancestor, or a container never called itself (a
        q = parent(p)  # ModuleList the forward indexes) whose parent is, ...
        while q not in ancestors:
            if q in t_calls:
                return False
            q = parent(q)
        return True
    units = [pair for pair in pairs if pair.torch and pair.torch not in ancestors and beside(pair.torch)]
    units.append(next(pair for pair in pairs if pair.torch == ""))
    return sorted(units, key=lambda pair: t_calls[pair.torch].end)
