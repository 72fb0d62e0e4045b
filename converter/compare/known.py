"""Units whose outputs an earlier pass recorded, returned instead of computed.

The binary search's sweep records a few units at a time, in execution order, after one pass has
recorded every unit's outputs (torch's and paddle's float32 ones, the float64 reference's
free-running ones). A pass of a later chunk need not compute the units before it: each returns
a copy of what it returned then, without running its code or making its block's weights, and
the pass costs the chunk's units and the model's code around them, not the whole model up to
them. The values are those the pass would compute (the same inputs, the same kernels), so the
rows are the same.

The last chunk records every unit (the modules holding them are judged on their calls), so its
forced passes force them too: there a unit returns what it returned in its own chunk's forced
passes (paddle's forced layer, the float64 reference forced), which `recording_forced` keeps.
Those were forced at the layers inside the unit too, where the last chunk would force the unit
at its boundary alone: the code between the units (the holders' own) is judged on what the units
hand on forced throughout, on both sides alike (its difference from torch, its float64 budget),
so that its own error is not mixed with the units' insides.

A unit is returned so only where that is the same thing: called once per forward on both sides,
its recorded structure kept (capture.Call.returned) and holding tensors and plain values alone (an
object with state of its own, such as a cache the next layers extend, belongs to the pass that
made it), as many float64 outputs as float32 ones. The
float64 reference's units compute where a format rounds its products: a dithered draw's random
numbers run through every product before (precision.torch_rounding).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ..frameworks import paddle_side, torch_side
from .paddle_own import _layer_at
from .replay import PLAIN
from ..tree import _children, flatten, is_tensor, replace

from .port import FORCED_PASS, Session


@dataclass
class Recorded:
    """What the units returned in passes already run: torch's and paddle's free-running calls
    (kept with their structure), the float64 reference's free-running outputs (`free`: torch path
    -> {None: arrays}), the calls a forward makes per side (`counts`), and per unit whose chunk
    ran, its outputs in the forced passes (`forced`: torch path -> {"paddle": arrays, "float64":
    arrays})."""

    t_calls: dict
    p_calls: dict
    free: dict
    counts: tuple[dict, dict]
    forced: dict = field(default_factory=dict)

    def returnable(self, unit, forced: bool) -> bool:
        """`unit` (a pair) may be returned: each side calls it once, its recorded outputs sit in a
        structure kept, and (`forced`) its forced passes' outputs were kept too."""
        t_call, p_call = self.t_calls.get(unit.torch), self.p_calls.get(unit.paddle)
        if t_call is None or p_call is None or t_call.returned is None or p_call.returned is None:
            return False
        if self.counts[0].get(unit.torch) != 1 or self.counts[1].get(unit.paddle) != 1:
            return False
        if flatten((t_call.returned, p_call.returned), _stateful):
            return False
        wide = self.forced.get(unit.torch, {}).get("float64") if forced else self.free.get(unit.torch, {}).get(None)
        if forced and len(self.forced.get(unit.torch, {}).get("paddle") or ()) != len(p_call.outputs):
            return False
        return wide is not None and len(wide) == len(t_call.outputs)


def _stateful(value) -> bool:
    """A value inside a returned structure that is neither a container, a tensor nor a plain value."""
    return _children(value) is None and not is_tensor(value) and not isinstance(value, PLAIN)


def float64_returned(session: Session) -> bool:
    """The float64 reference's units are returned (every format in use is fp32; see the module)."""
    return set(session.formats.values()) <= {"fp32"}


@contextlib.contextmanager
def returning_recorded(session: Session, units, recorded: Recorded, forced: bool):
    """While inside, each of `units` (pairs; see Recorded.returnable) returns, in the torch model,
    the paddle model and (float64_returned) the float64 reference, a copy of what it returned in
    the recorded passes, with the same structure, in place of running: the free-running outputs,
    or, where `forced` (a chunk whose passes force them), in paddle's forced pass and the float64
    reference its own chunk's forced outputs. The models are put back as they were after."""
    import paddle
    import torch
    patched = []

    def returning(module, call, outputs, forced_outputs=None):
        is_float = paddle_side.is_float_tensor if isinstance(module, paddle.nn.Layer) else torch_side.is_float_tensor

        def forward(*args, **kwargs):
            made = forced_outputs if forced_outputs is not None and FORCED_PASS.get() else outputs
            return replace(call.returned, [make() for make in made], is_float)
        forward.returns_recorded = True  # a streamed model's block is not made for it (widen.BlockTensors.hook)
        patched.append((module, module.__dict__.get("forward")))
        object.__setattr__(module, "forward", forward)

    try:
        for unit in units:
            t_call, p_call = recorded.t_calls[unit.torch], recorded.p_calls[unit.paddle]
            returning(session.torch_model.get_submodule(unit.torch), t_call,
                      [lambda t=t: t.clone() for t in t_call.outputs])
            own = recorded.forced.get(unit.torch, {}) if forced else {}
            returning(_layer_at(session.paddle_model, unit.paddle), p_call,
                      [lambda t=t: t.clone() for t in p_call.outputs],
                      [lambda a=a, t=t: paddle.to_tensor(a, place=t.place) for a, t in zip(own["paddle"], p_call.outputs)]
                      if forced else None)
            if float64_returned(session):
                wide = own["float64"] if forced else recorded.free[unit.torch][None]
                returning(session.torch64_module(unit.torch), t_call, [lambda a=a: torch.tensor(a) for a in wide])
        yield
    finally:
        for module, own_forward in reversed(patched):
            if own_forward is None:
                object.__delattr__(module, "forward")
            else:
                object.__setattr__(module, "forward", own_forward)


@contextlib.contextmanager
def recording_forced(session: Session, units, recorded: Recorded):
    """While inside, the outputs of `units` in paddle's forced pass and in the float64 reference's
    first pass (forced, where a chunk records them) are kept in recorded.forced, as arrays, for the
    last chunk (see returning_recorded); nothing where the float64 reference is not returned."""
    if not float64_returned(session):
        yield
        return
    handles = []

    def keep(path, kind, side, when=lambda: True):
        def post(layer, args, out):
            own = recorded.forced.setdefault(path, {})
            if kind not in own and when():
                own[kind] = [side.to_numpy(t).copy() for t in flatten(out, side.is_float_tensor)]
        return post
    for unit in units:
        handles += paddle_side.add_hooks(_layer_at(session.paddle_model, unit.paddle),
                                         post=keep(unit.torch, "paddle", paddle_side, FORCED_PASS.get))
        handles += torch_side.add_hooks(session.torch64_module(unit.torch), post=keep(unit.torch, "float64", torch_side))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
