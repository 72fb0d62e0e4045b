"""Units whose outputs an earlier pass recorded, returned instead of computed.

The binary search's sweep records a few units at a time, in execution order, after one pass has
recorded every unit's outputs (torch's and paddle's float32 ones, the float64 reference's
free-running ones). A pass of a later chunk need not compute the units before it: each returns
a copy of what it returned then, without running its code or making its block's weights, and
the pass costs the chunk's units and the model's code around them, not the whole model up to
them. The values are those the pass would compute (the same inputs, the same kernels), so the
rows are the same.

A unit is returned so only where that is the same thing: called once per forward on both sides,
its recorded structure kept (capture.Call.returned), as many float64 outputs as float32 ones. The
float64 reference's units compute where a format rounds its products: a dithered draw's random
numbers run through every product before (precision.torch_rounding).
"""

from __future__ import annotations

import contextlib

from ..frameworks import paddle_side, torch_side
from ..tree import replace


def returnable(unit, t_calls: dict, p_calls: dict, free: dict, counts: tuple[dict, dict]) -> bool:
    """`unit` (a pair) may be returned from the recorded calls: each side calls it once, and its
    recorded outputs (torch's, paddle's, the float64 reference's) sit in a structure kept."""
    t_call, p_call = t_calls.get(unit.torch), p_calls.get(unit.paddle)
    if t_call is None or p_call is None or t_call.returned is None or p_call.returned is None:
        return False
    if counts[0].get(unit.torch) != 1 or counts[1].get(unit.paddle) != 1:
        return False
    wide = free.get(unit.torch, {}).get(None)
    return wide is not None and len(wide) == len(t_call.outputs)


@contextlib.contextmanager
def returning_recorded(session, units, t_calls: dict, p_calls: dict, free: dict):
    """While inside, each of `units` (pairs; see returnable) returns, in the torch model, the paddle
    model and (where every format is fp32) the float64 reference, a copy of what it returned in the
    recorded calls (`free`: torch path -> {None: the float64 reference's outputs there, as arrays}),
    with the same structure, in place of running. The models are put back as they were after."""
    import paddle
    import torch
    patched = []

    def returning(module, call, outputs):
        def forward(*args, **kwargs):
            return replace(call.returned, [make() for make in outputs], is_float)
        is_float = paddle_side.is_float_tensor if isinstance(module, paddle.nn.Layer) else torch_side.is_float_tensor
        patched.append((module, module.__dict__.get("forward")))
        object.__setattr__(module, "forward", forward)

    float64_too = set(session.formats.values()) <= {"fp32"}
    try:
        for unit in units:
            t_call, p_call = t_calls[unit.torch], p_calls[unit.paddle]
            returning(session.torch_model.get_submodule(unit.torch), t_call,
                      [lambda t=t: t.clone() for t in t_call.outputs])
            returning(_paddle_layer(session.paddle_model, unit.paddle), p_call,
                      [lambda t=t: t.clone() for t in p_call.outputs])
            if float64_too:
                returning(session.torch64_module(unit.torch), t_call,
                          [lambda a=a: torch.tensor(a) for a in free[unit.torch][None]])
        yield
    finally:
        for module, own in reversed(patched):
            if own is None:
                object.__delattr__(module, "forward")
            else:
                object.__setattr__(module, "forward", own)


def _paddle_layer(model, path: str):
    """The paddle layer at `path`, its block's weights not made (session.paddle_layer makes them)."""
    layer = model
    for part in filter(None, path.split(".")):
        layer = layer._sub_layers[part]
    return layer
