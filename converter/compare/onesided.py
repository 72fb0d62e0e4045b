"""Tensors that count on one side only, as findings in the report's notes: a paddle parameter that
no torch tensor fills and that the paddle model reads (it computes with the value it was built
with: a bug of the port, whichever layer's output it changes), and a paddle parameter the paddle
model does not read (one torch's weights fill while torch reads them: the port computes without
that weight; one nothing fills: left over in the port). Measured by compare/unread.py; a paddle
parameter whose torch counterpart torch does not read either on these inputs (an expert no token
is routed to) is said in a plain note, not as a finding."""

from __future__ import annotations

from .unread import Perturbation, measure_reads

SHOWN = 6


def _where(path: str) -> str:
    return f"'{path}'" if path else "the model itself"


def _listed(keys: list[str], layer: str = "", after=lambda key: "") -> str:
    """The first SHOWN keys, by their names inside `layer`, each followed by after(key)."""
    shown = ", ".join(f"'{k[len(layer) + 1:] if layer else k}'{after(k)}" for k in keys[:SHOWN])
    return shown + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


def _parameters(paddle_model) -> dict[str, object]:
    """The paddle model's floating parameters by their first state-dict key (aliases left out)."""
    from ..frameworks.paddle_side import is_float_tensor
    params = {id(p) for p in paddle_model.parameters()}
    out, seen = {}, set()
    for key, tensor in paddle_model.state_dict().items():
        if id(tensor) in params and id(tensor) not in seen and is_float_tensor(tensor):
            seen.add(id(tensor))
            out[key] = tensor
    return out


def state_findings(plan, torch_model, paddle_model, inputs, device: str) -> list[str]:
    """Notes on the paddle parameters of `plan` (verify-port's plan between the two models in
    memory) that count on one side only, measured on the spec's `inputs` (see the module's
    docstring), one per paddle layer and kind; [] where every parameter is read and filled."""
    from ..frameworks import paddle_side
    state = _parameters(paddle_model)
    unfilled = [i.name for i in plan.unfilled if i.name in state]
    readings = measure_reads(paddle_side, paddle_model, inputs, device, state, list(state), set(unfilled))
    filled = plan.by_output_name()
    unread = [k for k, r in readings.items() if r.read is False and k in filled]
    sources = {k: [part.source for part in filled[k].parts] for k in unread}
    torch_reads = _torch_reads(sources, torch_model, inputs, device)
    neither = [k for k in unread if all(torch_reads.get(s) is not None and torch_reads[s].read is False
                                        for s in sources[k])]
    notes = []
    whys = {r.why for r in readings.values() if r.read is None and r.key not in unfilled}
    if whys and all(r.read is None for r in readings.values()):
        notes.append(f"whether the paddle model reads each of its parameters was not measured: {sorted(whys)[0]}")
    for layer, keys in _by_layer(readings, [k for k in unfilled if readings[k].read is None]).items():
        notes.append(f"paddle layer {_where(layer)} holds {len(keys)} tensor(s) that no torch tensor fills, left as "
                     f"the paddle model holds them: {_listed(keys, layer)}; whether the model reads them was "
                     f"not measured ({readings[keys[0]].why})")
    spare = [k for k in unread if k not in neither]
    written = [k for k in state if readings[k].written and k in filled and k not in spare]
    if written:
        shown = _listed(written, after=lambda k: f" (from torch's {' + '.join(repr(p.source) for p in filled[k].parts)})")
        notes.append(f"finding: the paddle model's forward overwrites {len(written)} tensor(s) that torch's weights "
                     f"fill, so the values converted from torch are never read: {shown}. Find what writes them in the "
                     "forward (a wrapper copying its own parameter into its inner layer's) and make it use torch's, or "
                     "map torch's tensors onto the tensors it copies from")
    for layer, keys in _by_layer(readings, [k for k in unfilled if readings[k].read]).items():
        notes.append(_read_unfilled(layer, keys, state, readings, spare + written))
    for layer, keys in _by_layer(readings, [k for k in unfilled if readings[k].read is False]).items():
        notes.append(_unread_unfilled(layer, keys, state, readings))
    for layer, keys in _by_layer(readings, spare).items():
        notes.append(_unread_filled(layer, keys, readings, sources, torch_reads))
    if neither:
        notes.append(f"{len(neither)} paddle parameter(s) change no output on either side on these inputs (perturbing "
                     "them or their torch counterparts changes neither model's outputs, as for an expert no token is "
                     f"routed to, or a weight that meets only zeros): {_listed(neither)}; inputs that reach them check "
                     "them")
    return notes


def _by_layer(readings: dict[str, Perturbation], keys: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in keys:
        out.setdefault(readings[key].layer, []).append(key)
    return out


def _torch_reads(sources: dict[str, list[str]], torch_model, inputs, device: str) -> dict[str, Perturbation]:
    """Whether torch reads the tensors that fill paddle parameters (`sources`: paddle key -> those tensors)."""
    if not sources:
        return {}
    from ..frameworks import torch_side
    from ..frameworks.torch_side import is_float_tensor
    state = {k: t for k, t in torch_model.state_dict(keep_vars=True).items() if is_float_tensor(t)}
    keys = list(dict.fromkeys(s for ones in sources.values() for s in ones if s in state))
    return measure_reads(torch_side, torch_model, inputs, device, state, keys)


def _largest(readings: dict[str, Perturbation], keys: list[str]) -> str:
    worst = max(readings[k].change for k in keys)
    return "an infinite or NaN value" if worst == float("inf") else f"up to {worst:.3g}"


def _read_unfilled(layer: str, keys: list[str], state: dict, readings: dict[str, Perturbation], spare: list[str]) -> str:
    at_layer = all(readings[k].at == layer for k in keys)
    effect = (f"perturbing each changed that layer's output, by {_largest(readings, keys)}" if at_layer else
              f"perturbing each changed the model's outputs, by {_largest(readings, keys)}")
    shapes = {tuple(state[k].shape) for k in keys}
    shaped = _listed(keys, layer, lambda k: f" {list(state[k].shape)}")
    elsewhere = _by_layer(readings, [k for k in spare if tuple(state[k].shape) in shapes])
    instead = ""
    if elsewhere:
        where = "; ".join(f"{_where(other)} ({_listed(ks, other)}"
                          f"{', a layer that never runs' if not readings[ks[0]].ran else ''})"
                          for other, ks in list(elsewhere.items())[:3])
        instead = (f" Torch's weights of those shapes fill paddle tensors whose values the model does not read, in {where}: the "
                   "port's forward reads its own tensors instead of those.")
    return (f"finding: paddle layer {_where(layer)} reads {len(keys)} tensor(s) that no torch tensor fills: "
            f"{shaped} ({effect}): the paddle model computes with values no torch weight gave "
            f"it, and a checkpoint converted under these rules would not fill them.{instead} Make the port's forward read the tensors "
            "torch's weights fill, or map torch's tensors onto these and remove what nothing reads; the first layer "
            "over budget is where the outputs part")


def _unread_unfilled(layer: str, keys: list[str], state: dict, readings: dict[str, Perturbation]) -> str:
    ran = readings[keys[0]].ran
    how = ("that layer never runs, and perturbing each left the model's outputs unchanged" if not ran else
           "perturbing each changed neither that layer's output nor the model's")
    shaped = _listed(keys, layer, lambda k: f" {list(state[k].shape)}")
    return (f"finding: paddle layer {_where(layer)} holds {len(keys)} tensor(s) that no torch tensor fills and the "
            f"paddle model does not read on these inputs: {shaped} ({how}); left as they are, they "
            "change nothing here: remove them from the port if they are left over, or make its forward use them "
            "where it should")


def _unread_filled(layer: str, keys: list[str], readings: dict[str, Perturbation], sources: dict[str, list[str]],
                   torch_reads: dict[str, Perturbation]) -> str:
    ran = readings[keys[0]].ran
    how = ("that layer never runs, and perturbing each left the model's outputs unchanged" if not ran else
           "perturbing each changed neither that layer's output nor the model's")
    filled = _listed(keys, layer, lambda k: f" (from torch's {' + '.join(repr(s) for s in sources[k])})")
    said = [torch_reads.get(s) for k in keys for s in sources[k]]
    read_by = sorted({r.at for r in said if r is not None and r.read})
    torch_part = (f"; torch reads them (perturbing each changed the output of torch's "
                  f"{', '.join(_where(a) for a in read_by)}): "
                  "the port computes without these weights" if read_by else
                  "; whether torch reads them was not measured")
    return (f"finding: paddle layer {_where(layer)} holds {len(keys)} tensor(s) that torch's weights fill and the "
            f"paddle model does not read on these inputs: {filled} ({how}){torch_part}. Make the port's forward use "
            "them, or map torch's tensors onto the tensors the port reads")
