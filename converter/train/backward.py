"""The backward pass, layer by layer: each paired paddle layer's vector-Jacobian product on torch's
recorded inputs and torch's recorded output gradient (teacher forcing), against torch's own local
product, with a budget from the same product in float64 (and in the format a side uses).

Modules and layers pair as the forward check pairs them (compare/align.py): the same path, the
conversion plan (a torch MultiheadAttention, whose fused in_proj_weight feeds paddle's q_proj, k_proj
and v_proj, with paddle's MultiHeadAttention), layers without weights of one kind in execution order
under one paired parent, and the models themselves. The torch modules one paddle layer fuses
(q|k|v, gate|up) are one unit: run together on their one input, their output gradients laid out
as the plan lays out the fused output, their input gradients summed. The paddle layer is called as paddle's own forward
called it, each tensor replaced by the torch input holding the same values (as the forward check
forces a layer); inputs that hold the same values are one input on both sides, so (x, x, x) against
(x,) compares the total gradient.
Each paddle parameter's gradient is compared with torch's through the conversion's own rules: the
slice of in_proj_weight the split gives q_proj.weight, transposed as its transpose rule says.

The culprit is the first layer in backward order over budget none of whose paired sublayers is
over budget: when the sublayers agree but their parent does not, the parent's own code is at
fault."""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..frameworks import paddle_side, torch_side
from ..compare.capture import Call, Recorder, record
from ..compare.forced import _paddle_keeps_float64
from ..compare.precision import U32, emulate_paddle_training, emulate_torch_training, remove
from ..compare.replay import TorchCopies, float64_reference, force_paddle_args
from ..compare.session import _float64_by_default, _forward_errors
from ..paths import is_under, relative
from ..tree import flatten, is_paddle_tensor, is_torch_tensor, map_leaves
from .judge import in_memory_order, judge
from .loop import call_model, to_paddle, to_torch, torch_loss


NARROW_UNIT = {"float32": U32, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff
FORWARD_AGREES = 1e-3
# paddle's own error is measured for a layer with a row past this share of its budget on torch's
# error alone (its kernels may reduce in other orders); below it, torch's stands in, a budget no larger
OWN_FROM = 0.5  # the paddle layer's forward on torch's inputs, relative to the output's scale
FORWARD_DIFFERS = " (its forward differs too)"
ZERO = "paddle's gradient is zero; "
SCALED = "paddle's gradient is torch's times "  # then the factor and "; "
SCALE_FIT = 1e-3  # a factor fits where paddle's gradient differs from torch's times it by this share of its norm
LOCAL = "local backward of "


def aligned(session) -> list:
    """The forward check's pairing of the training models (compare/align.py: the same path, the
    conversion plan, fused layers, the same kind of layer in execution order), on copies of the
    models run once on the spec's inputs; computed once per session."""
    if session.layer_pairs is None:
        from ..compare.align import align
        calls = []
        for side, model, which in ((torch_side, session.run_only_copy("torch"), "torch_model()"),
                                   (paddle_side, session.run_only_copy("paddle"), "paddle_model()")):
            recorder = record(side, model, Recorder())
            try:
                with _forward_errors(f"{which} in training mode", session.spec.path):
                    side.forward(model, session.port.inputs, session.device)
            finally:
                recorder.remove()
            calls.append(recorder.calls)
        session.layer_pairs = align(calls[0], calls[1], session.port.plan)
    return session.layer_pairs


def layer_pairs(session) -> dict:
    """torch module path -> paddle layer path, as the forward check pairs them (see aligned); the
    torch modules a paddle layer fuses (q|k|v) are fused_groups'."""
    pairs = {pair.torch: pair.paddle for pair in aligned(session) if pair.part is None}
    pairs.setdefault("", "")
    return pairs


def fused_groups(session) -> dict:
    """paddle layer path -> [(torch module path, its Slice)] for each paddle layer that fuses several
    torch modules (q|k|v, gate|up), the modules in the plan's order."""
    from ..compare.fused import Slice
    out = {}
    for pair in aligned(session):
        if isinstance(pair.part, Slice):
            out.setdefault(pair.paddle, []).append((pair.torch, pair.part))
    return out


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


class Inputs:
    """A recorded torch call's floating inputs, those holding the same values taken as one input
    (in order of first use): its gradient is the sum over every place it was passed."""

    def __init__(self, call: Call):
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


def _torch_local(module, call: Call, inputs: Inputs, grads: list, dtype, moved: float = 0.0):
    """(input gradients, one per input of `inputs`; {param name: gradient}; the ops that gave a
    narrower float from float64, in a float64 run) of torch's module on the recorded call; `moved`:
    each input moved first by that relative amount, with a fixed random sign per element."""
    import torch
    leaves = [g[0].to(dtype).cpu() if dtype == torch.float64 else g[0].clone() for g in inputs.groups]
    if moved:
        signs = np.random.default_rng(0)
        leaves = [t * (1.0 + moved * torch.from_numpy(signs.choice([-1.0, 1.0], tuple(t.shape))).to(t.dtype))
                  for t in leaves]
    leaves = [t.requires_grad_(True) for t in leaves]

    def leaf(v):
        if v.is_floating_point():
            return leaves[inputs.index(v)]
        return v.cpu() if dtype == torch.float64 else v
    args, kwargs = map_leaves(call.args, leaf, is_torch_tensor), map_leaves(call.kwargs, leaf, is_torch_tensor)
    watch = _narrowing(dtype)
    with watch:
        with _reference(dtype):
            outs = flatten(module(*args, **kwargs))
        params = dict(module.named_parameters())
        targets = leaves + list(params.values())
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        # the backward as the forward's graph says: a cast's gradient goes back to the dtype its input had
        got = torch.autograd.grad([o for o, _ in pairs], targets, [g.to(o.dtype).to(o.device) for o, g in pairs],
                                  allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape)) if g is None else torch_side.to_numpy(g)
    n = len(leaves)
    return ([as_np(g, t) for g, t in zip(got[:n], leaves)],
            {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, watch.ops)


@contextlib.contextmanager
def _reference(dtype):
    """A float64 forward under the forward check's float64 guarantees (casts to a lower float format
    and tensors made in the default dtype stay float64: HF's RMSNorm computes in float32 whatever
    its input); any other run as it is."""
    import torch
    if dtype != torch.float64:
        yield
        return
    with float64_reference(), _float64_by_default():
        yield


def _narrowing(dtype):
    """For a float64 run, a dispatch mode whose `ops` lists each op (once, with the format) that gave
    a floating tensor narrower than float64 from a float64 input: where the reference is not float64.
    For any other run, a block that records nothing."""
    import torch
    return _narrowing_mode()() if dtype == torch.float64 else _Unwatched()


class _Unwatched(contextlib.nullcontext):
    """A run that is not watched for narrowing: it records no op."""

    ops = ()


@functools.cache
def _narrowing_mode() -> type:
    """The class of _narrowing's dispatch mode (torch imported when first asked for)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Narrowing(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            narrow = [t.dtype for t in (out if isinstance(out, (tuple, list)) else (out,))
                      if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64]
            if narrow and any(t.dtype == torch.float64 for t in flatten((args, kwargs))):  # the inputs only then
                for dtype in narrow:
                    found = (str(func), str(dtype).removeprefix("torch."))
                    if found not in self.ops:
                        self.ops.append(found)
            return out
    return Narrowing


def _paddle_call(call: Call, p_call):
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


class Unpaired(Exception):
    """A layer whose outputs do not correspond on the two sides: it is left out, the message says why."""


class WrongCotangent(RuntimeError):
    """A gradient about to be handed to a framework for an output of another shape: this package's
    own error (an internal error), never computed on."""


def _paddle_local(layer, forced: tuple, inputs: Inputs, grads: list, wide: bool = False):
    """(input gradients, one per input of `inputs`, None where paddle's call does not take it;
    {param name: gradient}; forward outputs) of the paddle layer on torch's recorded inputs (`forced`:
    what _paddle_call made of them); with `wide`, the layer (a float64 copy of it) in float64, casts
    inside kept float64."""
    import paddle
    args, kwargs, sources = forced
    if not wide:  # a fresh leaf per run: the float64 run widens copies of the same tensors
        args, kwargs, sources = _fresh_leaves(args, kwargs, sources)
    if wide:
        widened = {}

        def widen(t):
            w = t.astype("float64") if t.dtype == paddle.float32 else t
            if id(t) in sources:
                widened[id(w)] = sources[id(t)]
            return w
        args, kwargs = map_leaves(args, widen, is_paddle_tensor), map_leaves(kwargs, widen, is_paddle_tensor)
        sources = widened
    leaves, where = [], []
    for t in flatten((args, kwargs)):
        i = inputs.index(sources[id(t)]) if id(t) in sources else None
        if i is not None and not any(t is u for u in leaves):
            t.stop_gradient = False
            leaves.append(t)
            where.append(i)
    with _paddle_keeps_float64() if wide else contextlib.nullcontext():
        outs = flatten(layer(*args, **kwargs))
        forward = [paddle_side.to_numpy(o) for o in outs]
        params = {n: p for n, p in layer.named_parameters() if not p.stop_gradient}
        pairs = [(o, _paddle_grad(g, o, i)) for i, (o, g) in enumerate(zip(outs, grads))
                 if g is not None and not o.stop_gradient]
        for o, g in pairs:  # paddle.grad reads a cotangent of another size out of bounds: never hand it one
            if tuple(g.shape) != tuple(o.shape):
                raise WrongCotangent(f"a gradient of shape {list(g.shape)} for an output of shape {list(o.shape)}")
        targets = leaves + list(params.values())
        got = paddle.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
    as_np = lambda g, t: np.zeros(tuple(t.shape), np.float32) if g is None else np.array(paddle_side.to_numpy(g))
    n = len(leaves)
    per_input = [None] * len(inputs.groups)
    for i, g, t in zip(where, got[:n], leaves):
        g = _unbroadcast(as_np(g, t), tuple(inputs.groups[i][0].shape))
        per_input[i] = g if per_input[i] is None else per_input[i] + g
    return per_input, {name: as_np(g, t) for (name, t), g in zip(params.items(), got[n:])}, forward


def _fresh_leaves(args, kwargs, sources: dict):
    """The call with each paddle tensor that is a copy of a torch input copied again (a leaf of its
    own for this run's gradient), `sources` following them."""
    fresh = {}

    def copy(t):
        if id(t) not in sources:
            return t
        c = t.detach().clone()
        fresh[id(c)] = sources[id(t)]
        return c
    args, kwargs = map_leaves(args, copy, is_paddle_tensor), map_leaves(kwargs, copy, is_paddle_tensor)
    return args, kwargs, fresh


def cotangent(grad: np.ndarray, shape: tuple) -> np.ndarray | None:
    """Torch's gradient of an output as the gradient of paddle's output of `shape` holding the same
    values: as it is; spread evenly over the copies where paddle's output is torch's broadcast (HF
    BERT's position embeddings of positions [1, T] against PaddleNLP's [B, T]: each copy takes its
    share, so the parameters' gradient is torch's); summed over the copies where torch's is
    paddle's broadcast; reshaped where they hold the same elements in another shape (a layer run on
    [B*T, H] against [B, T, H]); None where the shapes do not correspond."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    try:
        spread = np.broadcast_shapes(grad.shape, shape) == shape
    except ValueError:
        spread = False
    if spread:
        return np.broadcast_to(grad, shape) / (math.prod(shape) // max(grad.size, 1))
    summed = _unbroadcast(grad, shape) if len(shape) <= grad.ndim else None
    if summed is not None and summed.shape == shape:
        return summed
    return grad.reshape(shape) if grad.size == math.prod(shape) else None


def _paddle_grad(grad, out, i: int):
    """Torch's output gradient as the gradient of paddle's output `out` (its i-th), shaped to it
    (see cotangent) and in its dtype (its width kept, as torch's own backward takes it in the
    output's dtype)."""
    import paddle
    g = torch_side.to_numpy(grad)
    shaped = cotangent(g, tuple(out.shape))
    if shaped is None:
        raise Unpaired(f"its output {i} is {list(out.shape)} on paddle's side against torch's {list(g.shape)}")
    g = paddle.to_tensor(np.ascontiguousarray(shaped))
    return g if g.dtype == out.dtype else g.astype(out.dtype)


def local_rows(session, tspec, batch) -> list:
    """Rows of phase backward, one per compared gradient, layers in backward order."""
    return LocalBackward(session, tspec, batch).rows()


class LocalBackward:
    """The per-layer backward on a batch in two halves: torch's when made (both models recorded on the
    batch, every torch local run), paddle's in rows() (paddle's local runs, paddle's own error, the
    rows). Paddle's half makes no torch tensor in the default dtype, so the training checks run it
    while torch's float64 run, which sets that dtype for the whole process, goes on another thread.
    The float64 copy is given back when torch's half is done, the run-only copies are not."""

    def __init__(self, session, tspec, batch):
        import torch
        from .result import Row
        self.session = session
        inputs, target = batch
        pairs = layer_pairs(session)
        fused = fused_groups(session)
        paths = set(pairs) | {t for group in fused.values() for t, _ in group}
        model = session.run_only_copy("torch")
        handed = _outputs_handed_on(model, paths)  # before the recorder's hooks: it records what they return
        recorder = record(torch_side, model, Recorder(paths, attached=True))
        handles = emulate_torch_training(model, session.formats["torch"])
        try:
            out = call_model(model, to_torch(inputs, torch.float32, session.device))
            torch_loss(tspec, out, to_torch(target, torch.float32, session.device), torch.float32).backward()
        finally:
            remove(handles + handed)
            recorder.remove()
        calls = {path: c for path, c in recorder.calls.items() if c.end >= 0}
        units = [_Unit.of(call, pairs[call.path]) for path, call in calls.items() if path in pairs]
        units += [u for ppath, group in fused.items() if (u := _Unit.fused(calls, ppath, group)) is not None]
        t32 = model  # its weights as they were: the backward above only filled their .grad
        t64 = session.torch_copy(torch.float64)
        self.fmt = fmt = session.formats["paddle"]
        tfmt = session.torch_copy() if fmt not in (None, "fp32") else None  # torch in paddle's format
        fmt_handles = emulate_torch_training(tfmt, fmt) if tfmt is not None else []
        self.pmodel = session.run_only_copy("paddle")
        self.p_calls = _record_paddle(self.pmodel, [u.ppath for u in units], inputs)
        t_handles = emulate_torch_training(t32, session.formats["torch"])
        self.halves = []  # per unit in backward order: rows already, or its torch half (_TorchLocal)
        try:
            for unit in sorted(units, key=lambda u: -u.call.end):
                if not any(g is not None for g in unit.grads):
                    continue
                if unit.call.count > 1:  # one recorded call's output gradient is not the sum over the calls
                    self.halves.append([Row("backward", 0, unit.label, unit.ppath or "<model>", None, note=(
                        f"called {unit.call.count} times in one forward: left out of the per-layer backward (its "
                        "parameters' end-to-end gradients are compared)"))])
                    continue
                self.halves.append(_torch_half(unit, t32, t64, tfmt if fmt_handles else None))
        finally:
            remove(fmt_handles + t_handles)
        session.done_with(t64, "torch", torch.float64)

    def rows(self) -> list:
        """Paddle's half and the rows, layers in backward order."""
        session = self.session
        players = dict(self.pmodel.named_sublayers(include_self=True))
        players64 = _Float64Layers(session) if self.fmt == "fp32" else None
        p_handles = emulate_paddle_training(self.fmt)
        rows = []
        try:
            for half in self.halves:
                if isinstance(half, list):
                    rows += half
                    continue
                unit = half.unit
                rows += _layer_rows(session, half, players[unit.ppath], players64, self.p_calls.get(unit.ppath))
        finally:
            remove(p_handles)
        return rows


class _Unit:
    """What one group of rows compares: a torch module on its recorded call (or the modules one
    paddle layer fuses, run together on their one input) against a paddle layer. `get(model)`: the
    module in a torch model; `local(name)`: a torch parameter's name in it (None: not in it);
    `p_grads`: the output gradients handed to paddle's layer; `reading(outputs)`: paddle's outputs
    as torch's."""

    def __init__(self, call, grads, ppath, get, local, p_grads, reading):
        self.call, self.grads, self.ppath = call, grads, ppath
        self.get, self.local, self.p_grads, self.reading = get, local, p_grads, reading
        self.label = call.path or "<model>"

    @classmethod
    def of(cls, call, ppath: str) -> _Unit:
        grads = [o.grad for o in call.outputs]
        return cls(call, grads, ppath, lambda m: m.get_submodule(call.path) if call.path else m,
                   lambda name: relative(name, call.path), grads, lambda outputs: outputs)

    @classmethod
    def fused(cls, calls: dict, ppath: str, group: list) -> _Unit | None:
        """The torch modules of `group` ((path, Slice) in the plan's order) as one unit against the
        paddle layer fusing them: their output gradients laid out as paddle's output holds them."""
        import torch
        from ..compare.capture import Call
        found = [calls.get(t) for t, _ in group]
        if any(c is None or len(c.outputs) != 1 for c in found):
            return None  # a module not called, or with an output of no gradient: judged within its parent
        paths, parts = [t for t, _ in group], [part for _, part in group]
        first = found[0]
        call = Call("+".join(paths), "fused", min(c.start for c in found), max(c.end for c in found), first.args,
                    first.kwargs, [c.outputs[0] for c in found], count=max(c.count for c in found))
        grads = [c.outputs[0].grad for c in found]
        if any(g is None for g in grads):
            grads = [torch.zeros_like(c.outputs[0]) if g is None else g for c, g in zip(found, grads)]

        def local(name):
            i = next((i for i, t in enumerate(paths) if relative(name, t) is not None), None)
            return None if i is None else f"parts.{i}.{relative(name, paths[i])}"
        if parts[0].output is not None:  # one output per module, in the plan's order
            p_grads = grads
        else:
            p_grads = [_laid_out(grads, parts)]
        return cls(call, grads, ppath, lambda m: _together([m.get_submodule(t) for t in paths]), local, p_grads,
                   lambda outputs: [part.of(outputs)[0] for part in parts])


def _laid_out(grads: list, parts: list):
    """Torch's gradients of the modules a paddle layer fuses, as one gradient of its output: each
    module's elements at its slice's runs, in its own order."""
    import torch
    axis = parts[0].axis
    size = sum(g.shape[axis] for g in grads)
    shape = list(grads[0].shape)
    shape[axis] = size
    out = torch.zeros(shape, dtype=grads[0].dtype, device=grads[0].device)
    for g, part in zip(grads, parts):
        offset = 0
        for a, b in part.spans:
            out.narrow(axis, a, b - a).copy_(g.narrow(axis, offset, b - a))
            offset += b - a
    return out


def _together(modules: list):
    """The torch modules one paddle layer fuses as one module: called on one input, their outputs
    in the plan's order."""
    import torch

    class Together(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.parts = torch.nn.ModuleList(modules)

        def forward(self, *args, **kwargs):
            return [m(*args, **kwargs) for m in self.parts]
    return Together()


def _outputs_handed_on(model, paths) -> list:
    """Hooks making each module at `paths` return a copy of every output that takes a gradient, a
    node of its own on the graph: the gradient retained on it is then the one the rest of the model
    gives that output. On the tensor itself it would also hold what the module's own computation
    passes back into it: HF's decoder attention returns the keys and values its output was computed
    from (its cache), and their gradient from that output would count twice in its local backward."""
    import torch

    def copies(module, args, output):
        return map_leaves(output, lambda t: t.clone() if t.requires_grad else t,
                          lambda v: isinstance(v, torch.Tensor) and v.is_floating_point())
    return [model.get_submodule(path).register_forward_hook(copies) for path in paths]


class _Float64Layers:
    """The layers of a float64 copy of paddle's model (paddle's own error is measured against it),
    made when first asked for; none where the model does not take float64."""

    def __init__(self, session):
        self.session = session
        self.layers = None

    def get(self, path: str):
        if self.layers is None:
            model = self.session.paddle_copy()
            try:
                model.to(dtype="float64")
                self.layers = dict(model.named_sublayers(include_self=True))
            except Exception:  # a model that does not take float64: torch's error stands in for paddle's
                self.layers = {}
        return self.layers.get(path)


@dataclass
class _TorchLocal:
    """Torch's half of one unit's local backward: its input and parameter gradients in fp32, float64
    and paddle's format (None where that is fp32), the condition where torch's float64 reference
    narrows, and the note that says so."""

    unit: _Unit
    inputs: Inputs
    g32: list
    p32: dict
    g64: list
    p64: dict
    gf: list | None
    pf: dict | None
    cond_in: list
    cond_p: dict
    said: str


def _torch_half(unit: _Unit, t32, t64, tfmt):
    """The unit's _TorchLocal, or its one row where it cannot be re-run alone."""
    import torch
    call, grads, get = unit.call, unit.grads, unit.get
    inputs = Inputs(call)
    grads64 = [g.double().cpu() if g is not None else None for g in grads]
    try:
        g32, p32, _ = _torch_local(get(t32), call, inputs, grads, torch.float32)
        g64, p64, narrowed = _torch_local(get(t64), call, inputs, grads64, torch.float64)
        gf, pf, _ = _torch_local(get(tfmt), call, inputs, grads, torch.float32) if tfmt is not None else (None, None, 0)
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        return [_not_rerun(unit, exc)]
    cond_in, cond_p, said = [None] * len(g64), {}, ""
    if narrowed:  # torch's reference is not float64 there: its observed error is no measure of fp32's
        ulp = max(NARROW_UNIT.get(d, U32) for _, d in narrowed)
        moved, moved_p, _ = _torch_local(get(t64), call, inputs, grads64, torch.float64, moved=2 * ulp)
        cond_in = [m - b for m, b in zip(moved, g64)]
        cond_p = {n: moved_p[n] - p64[n] for n in p64}
        said = (f"torch's float64 reference narrows to {', '.join(sorted({d for _, d in narrowed}))} in "
                f"{', '.join(op for op, _ in narrowed[:3])}: budget from its change under inputs moved by one unit "
                "in the last place of that format; ")
    return _TorchLocal(unit, inputs, g32, p32, g64, p64, gf, pf, cond_in, cond_p, said)


def _not_rerun(unit: _Unit, exc: Exception):
    from .result import Row
    return Row("backward", 0, unit.label, unit.ppath or "<model>", None,
               note=f"not re-run alone ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")


def _layer_rows(session, half: _TorchLocal, player, players64, p_call) -> list:
    """The rows of one unit's local backward from torch's half and paddle's layer (`players64`: the
    float64 copy's layers, or None); the whole model's measure of paddle's own error goes to
    session.paddle_own."""
    from .result import Row
    unit, inputs = half.unit, half.inputs
    call, ppath = unit.call, unit.ppath
    g32, p32, g64, p64, gf, pf = half.g32, half.p32, half.g64, half.p64, half.gf, half.pf
    cond_in, cond_p, said = half.cond_in, half.cond_p, half.said
    p_grads64 = [g.double().cpu() if g is not None else None for g in unit.p_grads]
    try:
        forced = _paddle_call(call, p_call)
        gp, pp, forward = _paddle_local(player, forced, inputs, unit.p_grads)
        forward = unit.reading(forward)
    except WrongCotangent:
        raise
    except Unpaired as exc:
        return [Row("backward", 0, unit.label, ppath or "<model>", None,
                    note=f"left out of the per-layer backward: {exc} (its parameters' end-to-end gradients are compared)")]
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        return [_not_rerun(unit, exc)]
    label = unit.label
    agrees = all(_same_values(a, torch_side.to_numpy(o)) for a, o in zip(forward, call.outputs))
    note = said + LOCAL + label + ("" if agrees else FORWARD_DIFFERS)

    # what each row compares, its note with it: (torch name, paddle name, torch's gradient, paddle's, torch's
    # error, its error in paddle's format, note, condition, where paddle's own error is found), made once
    compared = []
    for i, (a, b, c) in enumerate(zip(g32, g64, gp)):
        if c is None:
            continue  # an input paddle's call does not take
        compared.append((f"{label} d input[{i}]", f"{ppath or '<model>'} d input[{i}]", a, c, (a - b).astype(np.float32),
                         None if gf is None else gf[i] - b, gradient_note(a, c) + note, cond_in[i], ("in", i)))
    for pair in session.pairs:
        names = [unit.local(t) for t in pair.torch]
        local = relative(pair.paddle, ppath)
        if local not in pp or not all(n in p32 for n in names):
            continue
        want, ref = _in_paddle(pair, names, p32), _in_paddle(pair, names, p64)
        fmt_err = None if pf is None else _in_paddle(pair, names, pf) - ref
        condition = _in_paddle(pair, names, cond_p) if cond_p else None
        compared.append((pair.torch_name, pair.paddle, want, pp[local], (want - ref).astype(np.float32), fmt_err,
                         gradient_note(want, pp[local]) + note, condition, ("p", local)))

    def judged(own: dict) -> list:
        return [judge("backward", 0, t, p, want, got, e_ref, formats=session.formats, fmt_err=fmt_err, note=said,
                      e_other=own.get(key), condition=condition)
                for t, p, want, got, e_ref, fmt_err, said, condition, key in compared]

    rows = judged({})
    if any(r.ratio is None or not r.ratio <= OWN_FROM for r in rows):  # torch's error alone does not cover it
        own_in, own_p = _paddle_own(players64 and players64.get(ppath), forced, inputs, p_grads64, gp, pp)
        if not ppath:
            session.paddle_own = dict(own_p)
        own = {("in", i): e for i, e in enumerate(own_in)}
        own.update((("p", n), e) for n, e in own_p.items())
        rows = judged(own)
    return rows


def _paddle_own(player64, forced, inputs, grads64, gp, pp) -> tuple[list, dict]:
    """Paddle's own fp32 error of the layer's gradients (its kernels reduce in orders of their own,
    which torch's observed error does not show): its gradients minus those of a float64 copy of the
    layer on the same inputs, per input and per parameter; None (torch's error stands in) where the
    copy does not run in float64 or its gradient comes out exactly equal (computed in float32 inside)."""
    if player64 is None:
        return [None] * len(gp), {}
    try:
        w_in, w_p, _ = _paddle_local(player64, forced, inputs, grads64, wide=True)
    except WrongCotangent:
        raise
    except Exception:  # a layer that does not run in float64: not measured
        return [None] * len(gp), {}
    own = lambda a, b: None if a is None or b is None or a.shape != b.shape or np.array_equal(a, b) \
        else np.subtract(a, b, dtype=np.float64).astype(np.float32)
    return [own(a, b) for a, b in zip(gp, w_in)], {n: e for n in pp if (e := own(pp[n], w_p.get(n))) is not None}


def _same_values(paddle_out: np.ndarray, torch_out: np.ndarray) -> bool:
    """Paddle's forward output holds torch's values within FORWARD_AGREES of its scale: in one
    shape, one of them broadcast to the other's, or the same elements in another shape."""
    if paddle_out.shape != torch_out.shape:
        try:
            shape = np.broadcast_shapes(paddle_out.shape, torch_out.shape)
        except ValueError:
            shape = None
        if shape in (paddle_out.shape, torch_out.shape):
            paddle_out, torch_out = np.broadcast_arrays(paddle_out, torch_out)
        elif paddle_out.size == torch_out.size:
            torch_out = torch_out.reshape(paddle_out.shape)
        else:
            return False
    scale = float(np.max(np.abs(paddle_out), initial=0)) + 1e-30
    return float(np.max(np.abs(paddle_out - torch_out), initial=0)) <= FORWARD_AGREES * scale


def _in_paddle(pair, names: list, grads: dict) -> np.ndarray:
    """A paddle parameter's gradient as torch's gradients give it, through the conversion's rules
    for that parameter (the slice a split takes, the transpose)."""
    return pair.to_paddle({t: grads[n] for t, n in zip(pair.torch, names)})


def zero_note(torch_grad, paddle_grad) -> str:
    """ZERO where paddle's gradient is zero and torch's is not, else ''."""
    return ZERO if not np.any(paddle_grad) and np.any(torch_grad) else ""


def gradient_note(torch_grad, paddle_grad) -> str:
    """ZERO where paddle's gradient is zero and torch's is not; SCALED and the factor where paddle's
    is torch's times a constant other than 1 (a custom backward that scales what it passes on); else ''."""
    zero = zero_note(torch_grad, paddle_grad)
    if zero:
        return zero
    factor = scale_of(torch_grad, paddle_grad)
    return "" if factor is None else f"{SCALED}{factor:.4g}; "


def scale_of(torch_grad, paddle_grad) -> float | None:
    """The constant paddle's gradient is torch's times (least squares), where it fits within
    SCALE_FIT of paddle's norm and is not 1 within that; else None."""
    a, b = np.asarray(torch_grad), np.asarray(paddle_grad)
    if a.shape != b.shape:
        return None
    a, b = (x.ravel() for x in in_memory_order(a, b))  # one order for both, copied in bands where it must be
    if a.dtype != np.float32 or b.dtype != np.float32:
        a, b = a.astype(np.float64), b.astype(np.float64)
    norm_a, norm_b = _sum_of(a, a), _sum_of(b, b)  # squared norms: finite where every element is
    low, high = a.size * FLOAT32_SUMS[0], FLOAT32_SUMS[1]
    if a.dtype == np.float32 and not (low < norm_a < high and low < norm_b < high):
        a, b = a.astype(np.float64), b.astype(np.float64)  # float32 would overflow or lose what underflows
        norm_a, norm_b = _sum_of(a, a), _sum_of(b, b)
    if not (math.isfinite(norm_a) and math.isfinite(norm_b)) or norm_a == 0 or norm_b == 0:
        return None
    factor = _sum_of(a, b) / norm_a
    if abs(factor - 1) <= SCALE_FIT:  # 1 within the fit: no factor to say, whatever the rest
        return None
    rest = np.multiply(a, a.dtype.type(-factor))
    rest += b
    fits = _sum_of(rest, rest) <= SCALE_FIT ** 2 * norm_b
    return factor if fits and abs(factor - 1) > SCALE_FIT else None


# the sums of squares scale_of takes in float32: above n * the first, what underflows in them (under
# 1.2e-38 each) is under a ten-millionth of them; below the second, no sum it forms overflows
FLOAT32_SUMS = (1e-31, 1e36)


def _sum_of(x: np.ndarray, y: np.ndarray) -> float:
    """sum(x * y) in their dtype, summed pairwise (within a few units of it, where BLAS's dot may not be)."""
    return float(np.add.reduce(np.multiply(x, y)))


def scale_in(row) -> str | None:
    """The factor a row's note says paddle's gradient is torch's times, as written there; else None."""
    _, found, rest = row.note.partition(SCALED)
    return rest.partition(";")[0] if found else None


def layer_of(row) -> str:
    """The layer of a row of the per-layer backward ('' for another row)."""
    _, found, layer = row.note.partition(LOCAL)
    return layer.removesuffix(FORWARD_DIFFERS) if found else ""


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
