"""The backward pass, layer by layer: each paired paddle layer's vector-Jacobian product on torch's
recorded inputs and torch's recorded output gradient (teacher forcing), against torch's own local
product, with a budget from the same product in float64 (and in the format a side uses).

A torch module and a paddle layer pair when their state (parameters and buffers, everything under
them) is one set of tensors through the mapping: a Linear with its Linear, and a torch
MultiheadAttention, whose fused in_proj_weight feeds paddle's q_proj, k_proj and v_proj, with
paddle's MultiHeadAttention. Layers without weights pair by the same path, and the models
themselves. The paddle layer is called as paddle's own forward called it, each tensor replaced by
the torch input holding the same values (as the forward check forces a layer); inputs that hold the
same values are one input on both sides, so (x, x, x) against (x,) compares the total gradient.
Each paddle parameter's gradient is compared with torch's through the conversion's own rules: the
slice of in_proj_weight the split gives q_proj.weight, transposed as its transpose rule says.

The culprit is the first layer in backward order over budget none of whose paired sublayers is
over budget: when the sublayers agree but their parent does not, the parent's own code is at
fault."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..frameworks import paddle_side, torch_side
from ..compare.capture import Recorder, record
from ..compare.replay import TorchCopies, force_paddle_args
from ..paths import depth, is_under, prefixes, relative
from ..tree import flatten, is_paddle_tensor, is_torch_tensor, map_leaves
from .judge import judge
from .loop import call_model, to_paddle, to_torch, torch_loss
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


def _state_under(names, paths: set) -> dict:
    """path -> the names (dotted state-dict names) under it, for each path in `paths` holding any."""
    out = defaultdict(set)
    for name in names:
        for prefix in prefixes(name)[:-1]:  # the modules above the tensor
            if prefix in paths:
                out[prefix].add(name)
    return {path: frozenset(held) for path, held in out.items()}


def _matched(torch_paths: list, paddle_paths: list) -> dict:
    """Modules and layers holding one set of tensors: the only one of each, else the same paths,
    else (as many on each side: wrappers nested around one set) outermost with outermost."""
    if len(torch_paths) == 1 and len(paddle_paths) == 1:
        return {torch_paths[0]: paddle_paths[0]}
    out = {t: t for t in torch_paths if t in paddle_paths}
    rest_t = sorted((t for t in torch_paths if t not in out), key=depth)
    rest_p = sorted((p for p in paddle_paths if p not in out.values()), key=depth)
    if len(rest_t) == len(rest_p):
        out.update(zip(rest_t, rest_p))
    return out


def _pairs_by_state(session, torch_paths: set, paddle_paths: set) -> dict:
    """torch module path -> paddle layer path, for those whose state is one set of tensors through
    the mapping: every paddle tensor under the layer is computed from torch tensors under the
    module, and every torch tensor under the module feeds only paddle tensors under the layer."""
    sources = {pair.paddle: frozenset(pair.torch) for pair in session.pairs}
    users = defaultdict(set)  # torch tensor -> the paddle tensors computed from it
    for name, torch_names in sources.items():
        for t in torch_names:
            users[t].add(name)
    by_state = defaultdict(lambda: ([], []))
    for path, held in _state_under(users, torch_paths).items():
        by_state[held][0].append(path)
    for path, held in _state_under(sources, paddle_paths).items():
        state = frozenset().union(*(sources[n] for n in held))
        if all(users[t] <= held for t in state):
            by_state[state][1].append(path)
    pairs = {}
    for torch_list, paddle_list in by_state.values():
        pairs.update(_matched(torch_list, paddle_list))
    return pairs


def layer_pairs(session) -> dict:
    """torch module path -> paddle layer path."""
    torch_paths = dict(session.torch_model.named_modules())
    paddle_paths = {p for p, _ in session.paddle_model.named_sublayers(include_self=True)}
    pairs = _pairs_by_state(session, set(torch_paths), paddle_paths)
    taken = set(pairs.values())
    for path, module in torch_paths.items():
        if path and path not in pairs and path in paddle_paths and path not in taken \
                and not any(True for _ in module.parameters()):
            pairs[path] = path
    pairs.setdefault("", "")
    return pairs


def _record(model, paths) -> tuple[dict, list]:
    calls, handles, counter = {}, [], [0]
    modules = dict(model.named_modules())
    for path in paths:
        def hook(mod, args, kwargs, out, _path=path):
            counter[0] += 1
            if _path in calls:
                calls[_path].calls += 1
                return
            outs = [o for o in flatten(out) if o.requires_grad]
            for o in outs:
                o.retain_grad()
            memo = {}  # a tensor passed twice stays one tensor
            calls[_path] = LayerCall(_path, counter[0], _detached(args, memo), _detached(kwargs, memo), outs)
        handles.append(modules[path].register_forward_hook(hook, with_kwargs=True))
    return calls, handles


def _record_paddle(model, paths, inputs) -> dict:
    """How paddle's own forward calls each layer at `paths` (the first call), on a batch."""
    import paddle
    recorder = record(paddle_side, model, Recorder(set(paths)))
    try:
        with paddle.no_grad():
            call_model(model, to_paddle(inputs))  # the same call as the loss probe's, which succeeded
    finally:
        recorder.remove()
    return recorder.calls


def _detached(value, memo: dict):
    """`value` with each torch tensor a detached copy; a tensor passed twice stays one copy."""
    def copy(t):
        if id(t) not in memo:
            memo[id(t)] = t.detach().clone()
        return memo[id(t)]
    return map_leaves(value, copy, is_torch_tensor)


class Inputs:
    """A recorded torch call's floating inputs, those holding the same values taken as one input
    (in order of first use): its gradient is the sum over every place it was passed."""

    def __init__(self, call: LayerCall):
        import torch
        self.groups: list[list] = []
        for t in flatten((call.args, call.kwargs)):
            if any(t is u for g in self.groups for u in g):
                continue
            group = next((g for g in self.groups if g[0].shape == t.shape and torch.equal(g[0], t)), None)
            if group is None:
                self.groups.append([t])
            else:
                group.append(t)

    def index(self, tensor) -> int | None:
        return next((i for i, g in enumerate(self.groups) if any(tensor is u for u in g)), None)


def _torch_local(module, call: LayerCall, inputs: Inputs, grads: list, dtype):
    """(input gradients, one per input of `inputs`; {param name: gradient}) of torch's module on the
    recorded call."""
    import torch
    leaves = [g[0].to(dtype).cpu() if dtype == torch.float64 else g[0].clone() for g in inputs.groups]
    leaves = [t.requires_grad_(True) for t in leaves]

    def leaf(v):
        if v.is_floating_point():
            return leaves[inputs.index(v)]
        return v.cpu() if dtype == torch.float64 else v
    args, kwargs = map_leaves(call.args, leaf, is_torch_tensor), map_leaves(call.kwargs, leaf, is_torch_tensor)
    outs = flatten(module(*args, **kwargs))
    params = dict(module.named_parameters())
    targets = leaves + list(params.values())
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    got = torch.autograd.grad([o for o, _ in pairs], targets, [g.to(o.dtype).to(o.device) for o, g in pairs],
                              allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape)) if g is None else torch_side.to_numpy(g)
    n = len(leaves)
    return ([as_np(g, t) for g, t in zip(got[:n], leaves)],
            {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])})


def _paddle_call(call: LayerCall, p_call):
    """(args, kwargs, {paddle tensor id: torch tensor}) for the paddle layer: its own recorded call
    with each tensor replaced by the torch input holding the same values; torch's call converted
    where paddle's forward did not call the layer."""
    import paddle
    if p_call is not None:
        handed = TorchCopies()
        args, kwargs, _ = force_paddle_args(tuple(p_call.args), dict(p_call.kwargs), call, handed)
        sources = {id(t): handed.source_of(t) for t in flatten((args, kwargs), is_paddle_tensor)}
        return args, kwargs, {k: v for k, v in sources.items() if v is not None}
    copies = {}

    def convert(v):
        if id(v) not in copies:
            copies[id(v)] = (paddle.to_tensor(v.cpu().numpy()), v)
        return copies[id(v)][0]
    args, kwargs = map_leaves(call.args, convert, is_torch_tensor), map_leaves(call.kwargs, convert, is_torch_tensor)
    return args, kwargs, {id(p): t for p, t in copies.values()}


def _unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """A gradient of a broadcast copy summed back to the shape it was broadcast from."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead > 0 else grad
    axes = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _paddle_local(layer, call: LayerCall, inputs: Inputs, grads: list, p_call):
    """(input gradients, one per input of `inputs`, None where paddle's call does not take it;
    {param name: gradient}; forward outputs) of the paddle layer on torch's recorded inputs."""
    import paddle
    args, kwargs, sources = _paddle_call(call, p_call)
    leaves, where = [], []
    for t in flatten((args, kwargs)):
        i = inputs.index(sources[id(t)]) if id(t) in sources else None
        if i is not None and not any(t is u for u in leaves):
            t.stop_gradient = False
            leaves.append(t)
            where.append(i)
    outs = flatten(layer(*args, **kwargs))
    forward = [paddle_side.to_numpy(o) for o in outs]
    params = {n: p for n, p in layer.named_parameters() if not p.stop_gradient}
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and not o.stop_gradient]
    targets = leaves + list(params.values())
    got = paddle.grad([o for o, _ in pairs], targets, [_paddle_grad(g, o.dtype) for o, g in pairs], allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape), np.float32) if g is None else np.array(paddle_side.to_numpy(g))
    n = len(leaves)
    per_input = [None] * len(inputs.groups)
    for i, g, t in zip(where, got[:n], leaves):
        g = _unbroadcast(as_np(g, t), tuple(inputs.groups[i][0].shape))
        per_input[i] = g if per_input[i] is None else per_input[i] + g
    return per_input, {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, forward


def _paddle_grad(grad, dtype):
    """Torch's output gradient as the gradient of a paddle output of `dtype` (its width kept, as
    torch's own backward takes it in the output's dtype)."""
    import paddle
    g = paddle.to_tensor(torch_side.to_numpy(grad))
    return g if g.dtype == dtype else g.astype(dtype)


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
    p_calls = _record_paddle(pmodel, [pairs[path] for path in calls], inputs)
    p_handles = session.emulation.apply_paddle(pmodel, fmt)
    t_handles = session.emulation.apply_torch(t32, session.formats["torch"])
    players = dict(pmodel.named_sublayers(include_self=True))
    rows = []
    try:
        for call in sorted(calls.values(), key=lambda c: -c.order):
            if not any(g is not None for g in grads[call.path]):
                continue
            ppath = pairs[call.path]
            if call.calls > 1:  # one recorded call's output gradient is not the sum over the calls
                from .result import Row
                rows.append(Row("backward", 0, call.path or "<model>", ppath or "<model>", None, note=(
                    f"called {call.calls} times in one forward: left out of the per-layer backward (its parameters' "
                    "end-to-end gradients are compared)")))
                continue
            rows += _layer_rows(session, call, grads[call.path], ppath, t32, t64, tfmt if fmt_handles else None,
                                players[ppath], p_calls.get(ppath))
    finally:
        remove(fmt_handles + p_handles + t_handles)
    return rows


def _layer_rows(session, call, grads, ppath, t32, t64, tfmt, player, p_call) -> list:
    import torch
    get = lambda m: m.get_submodule(call.path) if call.path else m
    inputs = Inputs(call)
    try:
        g32, p32 = _torch_local(get(t32), call, inputs, grads, torch.float32)
        g64, p64 = _torch_local(get(t64), call, inputs, [g.double().cpu() if g is not None else None for g in grads],
                                torch.float64)
        gf, pf = _torch_local(get(tfmt), call, inputs, grads, torch.float32) if tfmt is not None else (None, None)
        gp, pp, forward = _paddle_local(player, call, inputs, grads, p_call)
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        from .result import Row
        return [Row("backward", 0, call.path or "<model>", ppath or "<model>", None,
                    note=f"not re-run alone ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")]
    label = call.path or "<model>"
    agrees = all(a.shape == tuple(o.shape) and float(np.max(np.abs(a - torch_side.to_numpy(o)), initial=0))
                 <= FORWARD_AGREES * (float(np.max(np.abs(a), initial=0)) + 1e-30)
                 for a, o in zip(forward, call.outputs))
    note = f"local backward of {label}" + ("" if agrees else FORWARD_DIFFERS)
    rows = []
    for i, (a, b, c) in enumerate(zip(g32, g64, gp)):
        if c is None:
            continue  # an input paddle's call does not take
        rows.append(judge("backward", 0, f"{label} d input[{i}]", f"{ppath or '<model>'} d input[{i}]", a, c,
                          (a - b).astype(np.float32), formats=session.formats,
                          fmt_err=None if gf is None else gf[i] - b, note=zero_note(a, c) + note))
    for pair in session.pairs:
        names = [relative(t, call.path) for t in pair.torch]
        local = relative(pair.paddle, ppath)
        if local not in pp or not all(n in p32 for n in names):
            continue
        want, ref = _in_paddle(pair, names, p32), _in_paddle(pair, names, p64)
        fmt_err = None if pf is None else _in_paddle(pair, names, pf) - ref
        rows.append(judge("backward", 0, pair.torch_name, pair.paddle, want, pp[local], (want - ref).astype(np.float32),
                          formats=session.formats, fmt_err=fmt_err, note=zero_note(want, pp[local]) + note))
    return rows


def _in_paddle(pair, names: list, grads: dict) -> np.ndarray:
    """A paddle parameter's gradient as torch's gradients give it, through the conversion's rules
    for that parameter (the slice a split takes, the transpose)."""
    return pair.to_paddle({t: grads[n] for t, n in zip(pair.torch, names)})


def zero_note(torch_grad, paddle_grad) -> str:
    """ZERO where paddle's gradient is zero and torch's is not, else ''."""
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
        if not any(o != here and is_under("" if o == "<model>" else o, path) for o in bad_layers):
            return r
    return bad[0] if bad else None
