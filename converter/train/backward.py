"""The backward pass, layer by layer: each paired paddle layer's vector-Jacobian product on torch's
recorded inputs and torch's recorded output gradient (teacher forcing), against torch's own local
product, with a budget from the same product in float64 (and in the format a side uses).

Layers pair by their parameters (a paddle layer whose own weights all come from one torch
module's), by the same path for layers without weights, and the models themselves. The culprit
is the first layer in backward order over budget none of whose paired sublayers is over budget:
when the sublayers agree but their parent does not, the parent's own code is at fault."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .judge import judge
from .loop import call_model, to_torch, torch_loss
from .emulate import remove


FORWARD_AGREES = 1e-3  # the paddle layer's forward on torch's inputs, relative to the output's scale
FORWARD_DIFFERS = " (its forward differs too)"
ZERO = "paddle's gradient is zero; "


@dataclass
class LayerCall:
    path: str
    order: int  # completion order in the forward
    args: tuple
    kwargs: dict
    outputs: list = field(default_factory=list)
    calls: int = 1


def _under(path: str, parent: str) -> bool:
    return parent == "" or path == parent or path.startswith(parent + ".")


def layer_pairs(session) -> dict:
    """torch module path -> paddle layer path."""
    owners = {}
    for pair in session.pairs:
        if len(pair.torch) != 1:
            continue
        p_layer, t_module = pair.paddle.rpartition(".")[0], pair.torch[0].rpartition(".")[0]
        owners.setdefault(p_layer, set()).add(t_module)
    claims = {}  # torch module -> the paddle layers whose weights come from it
    for p, t in owners.items():
        for module in t:
            claims.setdefault(module, set()).add(p)
    pairs = {next(iter(t)): p for p, t in owners.items() if len(t) == 1 and len(claims[next(iter(t))]) == 1}
    torch_paths = dict(session.torch_model.named_modules())
    paddle_paths = {p for p, _ in session.paddle_model.named_sublayers(include_self=True)}
    for path, module in torch_paths.items():
        if path and path not in pairs and path in paddle_paths and not any(True for _ in module.parameters()):
            pairs[path] = path
    pairs.setdefault("", "")
    return {t: p for t, p in pairs.items() if t in torch_paths and p in paddle_paths}


def _record(model, paths) -> tuple[dict, list]:
    import torch
    calls, handles, counter = {}, [], [0]
    modules = dict(model.named_modules())
    for path in paths:
        def hook(mod, args, kwargs, out, _path=path):
            counter[0] += 1
            if _path in calls:
                calls[_path].calls += 1
                return
            outs = [o for o in _tensors(out) if o.is_floating_point() and o.requires_grad]
            for o in outs:
                o.retain_grad()
            calls[_path] = LayerCall(_path, counter[0], _detached(args), _detached(kwargs), outs)
        handles.append(modules[path].register_forward_hook(hook, with_kwargs=True))
    del torch
    return calls, handles


def _tensors(value) -> list:
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _detached(value):
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    if isinstance(value, list):
        return [_detached(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _as(value, convert):
    if isinstance(value, tuple):
        return tuple(_as(v, convert) for v in value)
    if isinstance(value, list):
        return [_as(v, convert) for v in value]
    if isinstance(value, dict):
        return {k: _as(v, convert) for k, v in value.items()}
    return convert(value)


def _torch_local(module, call: LayerCall, grads: list, dtype):
    """(input gradients, {param name: gradient}) of torch's module on the recorded call."""
    import torch
    leaves = []

    def leaf(v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            t = v.to(dtype).cpu().requires_grad_(True) if dtype == torch.float64 else v.clone().requires_grad_(True)
            leaves.append(t)
            return t
        return v.cpu() if isinstance(v, torch.Tensor) and dtype == torch.float64 else v
    args, kwargs = _as(call.args, leaf), _as(call.kwargs, leaf)
    outs = [o for o in _tensors(module(*args, **kwargs)) if o.is_floating_point()]
    params = dict(module.named_parameters())
    targets = leaves + list(params.values())
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    got = torch.autograd.grad([o for o, _ in pairs], targets, [g.to(o.dtype).to(o.device) for o, g in pairs],
                              allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape)) if g is None else g.detach().cpu().numpy()
    n = len(leaves)
    return ([as_np(g, t) for g, t in zip(got[:n], leaves)],
            {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])})


def _paddle_local(layer, call: LayerCall, grads: list):
    import paddle
    leaves = []

    def leaf(v):
        import torch
        if isinstance(v, torch.Tensor):
            t = paddle.to_tensor(v.cpu().numpy())
            if v.is_floating_point():
                t.stop_gradient = False
                leaves.append(t)
            return t
        return v
    args, kwargs = _as(call.args, leaf), _as(call.kwargs, leaf)
    outs = [o for o in _paddle_tensors(layer(*args, **kwargs)) if o.dtype in (paddle.float32, paddle.float64)]
    forward = [np.array(o.numpy()) for o in outs]
    params = {n: p for n, p in layer.named_parameters() if not p.stop_gradient}
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and not o.stop_gradient]
    targets = leaves + list(params.values())
    got = paddle.grad([o for o, _ in pairs], targets, [paddle.to_tensor(g.cpu().numpy()) for _, g in pairs],
                      allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape), np.float32) if g is None else np.array(g.numpy())
    n = len(leaves)
    return ([as_np(g, t) for g, t in zip(got[:n], leaves)],
            {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, forward)


def _paddle_tensors(value) -> list:
    import paddle
    if isinstance(value, paddle.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _paddle_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _paddle_tensors(v)]
    return []


def _prefixed(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def local_rows(session, tspec, batch) -> list:
    """Rows of phase backward, one per compared gradient, layers in backward order."""
    import torch
    inputs, target = batch
    pairs = layer_pairs(session)
    model = session.torch_copy()
    calls, handles = _record(model, list(pairs))
    handles += session.emulation.apply_torch(model, session.formats["torch"])
    try:
        out = call_model(model, to_torch(inputs, torch.float32, session.device))
        torch_loss(tspec, out, to_torch(target, torch.float32, session.device), torch.float32).backward()
    finally:
        remove(handles)
    grads = {path: [o.grad for o in c.outputs] for path, c in calls.items()}
    t32 = session.torch_copy()
    t64 = session.torch_copy(torch.float64)
    tfmt = session.torch_copy()
    fmt = session.formats["paddle"]
    fmt_handles = session.emulation.apply_torch(tfmt, fmt) if fmt != "fp32" else []
    pmodel = session.paddle_copy()
    p_handles = session.emulation.apply_paddle(pmodel, fmt)
    t_handles = session.emulation.apply_torch(t32, session.formats["torch"])
    players = dict(pmodel.named_sublayers(include_self=True))
    by_torch = {p.torch[0]: p for p in session.pairs if len(p.torch) == 1}
    rows = []
    try:
        for call in sorted(calls.values(), key=lambda c: -c.order):
            if call.calls > 1 or not any(g is not None for g in grads[call.path]):
                continue
            rows += _layer_rows(session, call, grads[call.path], pairs[call.path], t32, t64, tfmt if fmt_handles
                                else None, players[pairs[call.path]], by_torch)
    finally:
        remove(fmt_handles + p_handles + t_handles)
    return rows


def _layer_rows(session, call, grads, ppath, t32, t64, tfmt, player, by_torch) -> list:
    import torch
    get = lambda m: m.get_submodule(call.path) if call.path else m
    try:
        g32, p32 = _torch_local(get(t32), call, grads, torch.float32)
        g64, p64 = _torch_local(get(t64), call, [g.double().cpu() if g is not None else None for g in grads],
                                torch.float64)
        gf, pf = _torch_local(get(tfmt), call, grads, torch.float32) if tfmt is not None else (None, None)
        gp, pp, forward = _paddle_local(player, call, grads)
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        from .result import Row
        return [Row("backward", 0, call.path or "<model>", ppath or "<model>", None,
                    note=f"not re-run alone ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")]
    label = call.path or "<model>"
    agrees = all(a.shape == tuple(o.shape) and float(np.max(np.abs(a - o.detach().cpu().numpy()), initial=0))
                 <= FORWARD_AGREES * (float(np.max(np.abs(a), initial=0)) + 1e-30)
                 for a, o in zip(forward, call.outputs))
    note = f"local backward of {label}" + ("" if agrees else FORWARD_DIFFERS)
    rows = []
    for i, (a, b, c) in enumerate(zip(g32, g64, gp)):
        rows.append(judge("backward", 0, f"{label} d input[{i}]", f"{ppath or '<model>'} d input[{i}]", a, c,
                          (a - b).astype(np.float32), formats=session.formats,
                          fmt_err=None if gf is None else gf[i] - b, note=_zero(a, c) + note))
    for name, a in p32.items():
        full = _prefixed(call.path, name)
        pair = by_torch.get(full)
        if pair is None:
            continue
        local = pair.paddle[len(ppath) + 1:] if ppath else pair.paddle
        if local not in pp:
            continue
        want, ref = pair.to_paddle({full: a}), pair.to_paddle({full: p64[name]})
        fmt_err = None if pf is None else pair.to_paddle({full: pf[name]}) - ref
        rows.append(judge("backward", 0, full, pair.paddle, want, pp[local], (want - ref).astype(np.float32),
                          formats=session.formats, fmt_err=fmt_err, note=_zero(want, pp[local]) + note))
    return rows


def _zero(torch_grad, paddle_grad) -> str:
    return ZERO if not np.any(paddle_grad) and np.any(torch_grad) else ""


def layer_of(row) -> str:
    note = row.note.removeprefix(ZERO)
    if not note.startswith("local backward of "):
        return ""
    return note[len("local backward of "):].removesuffix(FORWARD_DIFFERS)


def culprit(rows: list):
    """The first bad local row in backward order whose layer has no bad paired sublayer; else the
    first bad row (an end-to-end gradient)."""
    bad = [r for r in rows if r.phase == "backward" and r.bad]
    local = [r for r in bad if layer_of(r)]
    bad_layers = {layer_of(r) for r in local}
    for r in local:
        here = layer_of(r)
        path = "" if here == "<model>" else here
        if not any(o != here and _under("" if o == "<model>" else o, path) for o in bad_layers):
            return r
    return bad[0] if bad else None
