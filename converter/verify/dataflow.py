"""Which earlier top-level units each unit reads, from one torch forward pass.

The binary search supposes that an error, once in, reaches every later unit, so that a unit
whose outputs are within budget clears every unit before it. That holds where each unit reads
the one before it, and fails where a unit starts over from the model's inputs: T5's decoder
begins on its own embedding of the decoder ids and reads the encoder only in its
cross-attention, so a probe there is clean whatever the encoder did. This pass tells the
two apart by tensor identity: a unit whose inputs are all the model's inputs (or views of
them), parameters, or outputs of known units reads exactly those units (and what they read);
an input of any other origin (made by an operation outside every module, such as a mask)
counts as reading every earlier unit, which is the search's own supposition.
"""

from __future__ import annotations

import weakref

EVERY = None  # reads every earlier unit


class Dataflow:
    """Hooks (see capture.record) that note, for each top-level unit in `units` (torch paths, in
    execution order), the units it reads."""

    def __init__(self, units: list[str]):
        self.order = list(units)  # "" (the whole model) included, as the search lists them
        self.units = [u for u in units if u]
        self.reads: dict[str, set | None] = {}
        self.handles = []
        self._made: dict[int, tuple] = {}  # id(tensor) -> (weak reference, module path that made it)
        self._inputs: dict[int, weakref.ref] = {}

    def wants(self, path: str) -> bool:
        return True

    def _pre(self, path, type_name, args, kwargs):
        from .capture import call_tensors
        tensors = call_tensors(args, kwargs, _is_tensor)
        if path == "" and not self._inputs:  # the model's own call: its inputs
            self._inputs = {id(t): weakref.ref(t) for t in tensors}
            return
        if path in self.units and path not in self.reads:
            self.reads[path] = self._origins(tensors)

    def _post(self, path, output, is_tensor):
        from .capture import flatten
        for t in flatten(output, _is_tensor):
            if id(t) not in self._made or self._made[id(t)][0]() is not t:  # the innermost module made it
                self._made[id(t)] = (weakref.ref(t), path)

    def _origins(self, tensors) -> set | None:
        found = set()
        for t in tensors:
            t = _root(t)
            if _is_parameter(t) or (id(t) in self._inputs and self._inputs[id(t)]() is t):
                continue
            made = self._made.get(id(t))
            unit = self._unit_of(made[1]) if made is not None and made[0]() is t else None
            if unit is None:
                return EVERY
            found.add(unit)
            more = self.reads.get(unit, EVERY)
            if more is EVERY:
                return EVERY
            found |= more
        return found

    def _unit_of(self, path: str) -> str | None:
        return next((u for u in self.units if path == u or path.startswith(u + ".")), None)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def cleared_by(self, index: int) -> set[int] | None:
        """Indexes (into the units as given) of the units that a clean probe at unit `index`
        clears besides itself; None: every earlier one."""
        reads = self.reads.get(self.order[index], EVERY)
        if reads is EVERY:
            return None
        return {self.order.index(u) for u in reads}


def _is_tensor(value) -> bool:
    import torch
    return isinstance(value, torch.Tensor)


def _is_parameter(t) -> bool:
    import torch
    return isinstance(t, torch.nn.Parameter)


def _root(t):
    """The tensor a view was taken of (through every level of views)."""
    while getattr(t, "_base", None) is not None:
        t = t._base
    return t


def trace(session, units: list[str]) -> Dataflow:
    """One torch forward pass with the hooks; the units each unit reads."""
    from ..frameworks import torch_side
    from .capture import record
    flow = record(torch_side, session.torch_model, Dataflow(units))
    try:
        session.run_torch()
    finally:
        flow.remove()
    return flow
