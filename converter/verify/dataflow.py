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

from ..compare.capture import call_key, module_path
from ..frameworks import torch_side

from ..compare.port import Session

EVERY = None  # reads every earlier unit


class Dataflow:
    """Hooks (see capture.record) that note, for each call of each top-level unit in `units`
    (torch paths and call keys, capture.call_key, in execution order), the unit calls it reads. A
    tensor is credited to the call of the unit that was running when a module first returned it."""

    def __init__(self, units: list[str]):
        self.order = list(units)  # "" (the whole model) included, as the search lists them
        self.units = {module_path(u) for u in units if u}
        self.reads: dict[str, set | None] = {}  # unit call key -> the unit calls it reads
        self.handles = []
        self.modules: dict = {}  # path -> module, as record() gives every recorder
        self._call_reads: dict[tuple[str, int], set | None] = {}  # (unit, call) -> units read
        self._calls: dict[str, int] = {}
        self._running: list[tuple[str, int]] = []  # the unit call in progress (units do not nest)
        self._made: dict[int, tuple] = {}  # id(tensor) -> (weak reference, (unit, call) or None)
        self._inputs: dict[int, weakref.ref] = {}

    def wants(self, path: str) -> bool:
        return True

    def _pre(self, path, type_name, args, kwargs):
        from ..compare.capture import call_tensors
        tensors = call_tensors(args, kwargs, torch_side.is_tensor)
        if path == "" and not self._inputs:  # the model's own call: its inputs
            self._inputs = {id(t): weakref.ref(t) for t in tensors}
            return
        if path in self.units:
            call = (path, self._calls.get(path, 0))
            self._calls[path] = call[1] + 1  # every call counted, as capture.call_key numbers them
            if self._running:  # inside another unit's call (T5's shared embedding, first called by the encoder)
                return
            self._call_reads[call] = self._origins(tensors)
            self.reads[call_key(path, call[1] + 1)] = self._call_reads[call]
            self._running.append(call)

    def _post(self, path, output, is_tensor):
        from ..tree import flatten
        maker = self._running[-1] if self._running else None
        for t in flatten(output, torch_side.is_tensor):
            if id(t) not in self._made or self._made[id(t)][0]() is not t:  # the first module to return it
                self._made[id(t)] = (weakref.ref(t), maker)
        if self._running and self._running[-1][0] == path:
            self._running.pop()

    def _origins(self, tensors) -> set | None:
        found = set()
        for t in tensors:
            origin = self._origin(t)
            if origin is EVERY:
                return EVERY
            found |= origin
        return found

    def _origin(self, t) -> set | None:
        """The units a tensor comes from: itself or the tensor it is a view of (at any level)."""
        while t is not None:
            if _is_parameter(t) or (id(t) in self._inputs and self._inputs[id(t)]() is t):
                return set()
            made = self._made.get(id(t))
            if made is not None and made[0]() is t:
                if made[1] is None:
                    return EVERY
                more = self._call_reads.get(made[1], EVERY)
                return EVERY if more is EVERY else {call_key(made[1][0], made[1][1] + 1)} | more
            t = getattr(t, "_base", None)
        return EVERY

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
        # a call of a unit's module that is no unit itself (T5's shared embedding called again by the
        # decoder) clears nothing of its own: what it read is among the reads already
        return {self.order.index(u) for u in reads if u in self.order}


def _is_parameter(t) -> bool:
    import torch
    return isinstance(t, torch.nn.Parameter)


def trace(session: Session, units: list[str]) -> Dataflow:
    """One torch forward pass with the hooks; the units each unit reads."""
    from ..compare.capture import record
    flow = record(torch_side, session.torch_model, Dataflow(units))
    try:
        session.run_torch()
    finally:
        flow.remove()
    return flow
