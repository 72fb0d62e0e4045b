"""The backward pass, layer by layer: each paired paddle layer's vector-Jacobian product on torch's
recorded inputs and torch's recorded output gradient (teacher forcing), against torch's own local
product, with a budget from the same product in float64 (and in the format a side uses).

Modules and layers pair as the forward check pairs them (compare/align.py), once per session (the
structure phase reads the pairs too): the same path, the conversion plan (a torch MultiheadAttention,
whose fused in_proj_weight feeds paddle's q_proj, k_proj and v_proj, with paddle's
MultiHeadAttention), layers without weights of one kind in execution order under one paired parent,
and the models themselves. The torch modules one paddle layer fuses (q|k|v, gate|up) are one unit:
run together on their one input, their output gradients laid out as the plan lays out the fused
output, their input gradients summed. The paddle layer is called as paddle's own forward called it
(local_runs.py); inputs that hold the same values are one input on both sides, so (x, x, x) against
(x,) compares the total gradient. Each paddle parameter's gradient is compared with torch's through
the conversion's own rules: the slice of in_proj_weight the split gives q_proj.weight, transposed as
its transpose rule says. The culprit is read from the rows (result.culprit)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..compare.capture import Call, Recorder, record
from ..compare.precision import U32, emulate_paddle_training, emulate_torch_training, remove
from ..compare.model_errors import forward_errors
from ..compare.paddle_own import BACKWARD, measures_own_error
from ..frameworks import paddle_side, torch_side
from ..paths import relative
from ..tree import map_leaves
from .judge import gradient_note, judge
from .loop import call_model, to_paddle, to_torch, torch_loss
from .local_runs import Inputs, Unpaired, WrongCotangent, paddle_call, paddle_local, paddle_own, torch_local
from ..results import Skipped
from .result import FORWARD_DIFFERS, LOCAL, Row
from .session import TrainSession

NARROW_UNIT = {"float32": U32, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff
FORWARD_AGREES = 1e-3  # the paddle layer's forward on torch's inputs, relative to the output's scale


@dataclass(frozen=True)
class LayerPairs:
    """modules: torch module path -> paddle layer path ("" -> "": the models themselves); fused:
    paddle layer path -> ((torch module path, its Slice), ...) for each paddle layer that fuses
    several torch modules (q|k|v, gate|up), the modules in the plan's order."""

    modules: dict
    fused: dict


def pair_layers(session: TrainSession) -> LayerPairs:
    from ..compare.align import align
    from ..compare.fused import Slice
    calls = []
    for side, model, which in ((torch_side, session.run_only_copy("torch"), "torch_model()"),
                               (paddle_side, session.run_only_copy("paddle"), "paddle_model()")):
        recorder = record(side, model, Recorder())
        try:
            with forward_errors(f"{which} in training mode", session.spec.path):
                side.forward(model, session.port.inputs, session.device)
        finally:
            recorder.remove()
        calls.append(recorder.calls)
    modules, fused = {}, {}
    for pair in align(calls[0], calls[1], session.port.plan):
        if pair.part is None:
            modules[pair.torch] = pair.paddle
        elif isinstance(pair.part, Slice):
            fused.setdefault(pair.paddle, []).append((pair.torch, pair.part))
    modules.setdefault("", "")
    return LayerPairs(modules, {path: tuple(group) for path, group in fused.items()})


@dataclass(frozen=True)
class Unit:
    """What one group of rows compares: a torch module on its recorded call (or the modules a paddle
    layer fuses) against a paddle layer. `get(model)`: the module in a torch model; `local(name)`: a
    torch parameter's name in it (None: not in it); `p_grads`: the output gradients handed to paddle's
    layer; `reading(outputs)`: paddle's outputs as torch's."""

    call: Call
    grads: list
    ppath: str
    get: Callable
    local: Callable
    p_grads: list
    reading: Callable

    @property
    def label(self) -> str:
        return self.call.path or "<model>"

    @classmethod
    def of(cls, call: Call, ppath: str) -> Unit:
        grads = [o.grad for o in call.outputs]
        return cls(call, grads, ppath, lambda m: m.get_submodule(call.path) if call.path else m,
                   lambda name: relative(name, call.path), grads, lambda outputs: outputs)

    @classmethod
    def fused(cls, calls: dict, ppath: str, group: tuple) -> Unit | None:
        """The torch modules of `group` ((path, Slice) in the plan's order) as one unit against the
        paddle layer fusing them: their output gradients laid out as paddle's output holds them."""
        import torch
        found = [calls.get(t) for t, _ in group]
        if any(c is None or len(c.outputs) != 1 for c in found):
            return None  # a module not called, or with an output of no gradient: judged within its parent
        paths, parts = [t for t, _ in group], [part for _, part in group]
        first = found[0]
        call = Call("+".join(paths), "fused", min(c.start for c in found), max(c.end for c in found), first.args,
                    first.kwargs, [c.outputs[0] for c in found], count=max(c.count for c in found))
        grads = [torch.zeros_like(c.outputs[0]) if (g := c.outputs[0].grad) is None else g for c in found]

        def local(name):
            i = next((i for i, t in enumerate(paths) if relative(name, t) is not None), None)
            return None if i is None else f"parts.{i}.{relative(name, paths[i])}"
        p_grads = grads if parts[0].output is not None else [_laid_out(grads, parts)]  # one output per module
        return cls(call, grads, ppath, lambda m: _together([m.get_submodule(t) for t in paths]), local, p_grads,
                   lambda outputs: [part.of(outputs)[0] for part in parts])


def _laid_out(grads: list, parts: list):
    """Torch's gradients of the modules a paddle layer fuses, as one gradient of its output: each
    module's elements at its slice's runs, in its own order."""
    import torch
    axis = parts[0].axis
    shape = list(grads[0].shape)
    shape[axis] = sum(g.shape[axis] for g in grads)
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


def outputs_handed_on(model, paths) -> list:
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


@dataclass(frozen=True)
class LocalRows:
    """The per-layer backward on a batch: its rows, layers in backward order; paddle's own fp32 error
    in the whole model's gradient per paddle parameter, where it was measured (the end-to-end
    gradients' budget takes it); the measurements skipped."""

    rows: list
    paddle_own: dict
    skipped: list


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


def _left_out(unit: Unit, note: str) -> Row:
    return Row("backward", 0, unit.label, unit.ppath or "<model>", None, note=note)


class LocalBackward:
    """The per-layer backward on a batch in two halves: torch's when made (both models recorded on the
    batch, every torch local run), paddle's in rows() (paddle's local runs, paddle's own error, the
    rows). Paddle's half makes no torch tensor in the default dtype, so the training checks run it
    while torch's float64 run, which sets that dtype for the whole process, goes on another thread.
    The float64 copy is given back when torch's half is done, the run-only copies are not."""

    def __init__(self, session: TrainSession, tspec, batch, pairs: LayerPairs):
        import torch
        self.session = session
        inputs, target = batch
        paths = set(pairs.modules) | {t for group in pairs.fused.values() for t, _ in group}
        model = session.run_only_copy("torch")
        handed = outputs_handed_on(model, paths)  # before the recorder's hooks: it records what they return
        recorder = record(torch_side, model, Recorder(paths, attached=True))
        handles = emulate_torch_training(model, session.formats["torch"])
        try:
            out = call_model(model, to_torch(inputs, torch.float32, session.device))
            torch_loss(tspec, out, to_torch(target, torch.float32, session.device)).backward()
        finally:
            remove(handles + handed)
            recorder.remove()
        calls = {path: c for path, c in recorder.calls.items() if c.end >= 0}
        units = [Unit.of(call, pairs.modules[call.path]) for path, call in calls.items() if path in pairs.modules]
        units += [u for ppath, group in pairs.fused.items() if (u := Unit.fused(calls, ppath, group)) is not None]
        t32 = model  # its weights as they were: the backward above only filled their .grad
        t64 = session.torch_copy(torch.float64)
        self.fmt = fmt = session.formats["paddle"]
        tfmt = session.torch_copy() if fmt not in (None, "fp32") else None  # torch in paddle's format
        fmt_handles = emulate_torch_training(tfmt, fmt) if tfmt is not None else []
        self.pmodel = session.run_only_copy("paddle")
        self.p_calls = _record_paddle(self.pmodel, [u.ppath for u in units], inputs)
        t_handles = emulate_torch_training(t32, session.formats["torch"])
        self.halves: list[TorchLocal | Row] = []  # per unit in backward order: its torch half, or its one row
        self.skipped: list[Skipped] = []
        try:
            for unit in sorted(units, key=lambda u: -u.call.end):
                if not any(g is not None for g in unit.grads):
                    continue
                if unit.call.count > 1:  # one recorded call's output gradient is not the sum over the calls
                    self.halves.append(_left_out(unit, f"called {unit.call.count} times in one forward: left out of "
                                                 "the per-layer backward (its parameters' end-to-end gradients are "
                                                 "compared)"))
                    continue
                half = torch_half(unit, t32, t64, tfmt if fmt_handles else None)
                if isinstance(half, Skipped):
                    self.skipped.append(half)
                    half = _left_out(unit, f"not re-run alone ({half.why})")
                self.halves.append(half)
        finally:
            remove(fmt_handles + t_handles)
        session.done_with(t64, "torch", torch.float64)

    def rows(self) -> LocalRows:
        """Paddle's half and the rows, layers in backward order."""
        session = self.session
        players = dict(self.pmodel.named_sublayers(include_self=True))
        layer64 = (lambda path: self._layers64.get(path)) if self.fmt == "fp32" else None
        p_handles = emulate_paddle_training(self.fmt)
        rows, own = [], {}
        try:
            for half in self.halves:
                if isinstance(half, Row):
                    rows.append(half)
                    continue
                ppath = half.unit.ppath
                found, measured, skips = layer_rows(session, half, players[ppath], layer64, self.p_calls.get(ppath))
                rows += found
                self.skipped += skips
                if measured is not None and not ppath:
                    own = dict(measured)
        finally:
            remove(p_handles)
        return LocalRows(rows, own, list(self.skipped))

    @functools.cached_property
    def _layers64(self) -> dict:
        """The layers of a float64 copy of paddle's model (paddle's own error is measured against it),
        made when first asked for; none where the model does not take float64 (the skip said)."""
        model = self.session.paddle_copy()
        try:
            model.to(dtype="float64")
        except Exception as exc:  # a model that does not take float64: torch's error stands in for paddle's
            self.skipped.append(Skipped.of("paddle's own error in the per-layer backward, on a float64 copy of "
                                           "paddle_model() (torch's error stands in for it)", exc))
            return {}
        return dict(model.named_sublayers(include_self=True))


@dataclass(frozen=True)
class TorchLocal:
    """Torch's half of one unit's local backward: its input and parameter gradients in fp32, float64
    and paddle's format (None where that is fp32), the condition where torch's float64 reference
    narrows, and the note that says so."""

    unit: Unit
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


def torch_half(unit: Unit, t32, t64, tfmt) -> TorchLocal | Skipped:
    """The unit's TorchLocal, or the skip where it cannot be re-run alone on torch's inputs."""
    import torch
    call, grads, get = unit.call, unit.grads, unit.get
    inputs = Inputs(call)
    grads64 = [g.double().cpu() if g is not None else None for g in grads]
    try:
        g32, p32, _ = torch_local(get(t32), call, inputs, grads, torch.float32)
        g64, p64, narrowed = torch_local(get(t64), call, inputs, grads64, torch.float64)
        gf, pf, _ = torch_local(get(tfmt), call, inputs, grads, torch.float32) if tfmt is not None else (None, None, 0)
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        return Skipped.of(f"the local backward of '{unit.label}'", exc)
    cond_in, cond_p, said = [None] * len(g64), {}, ""
    if narrowed:  # torch's reference is not float64 there: its observed error is no measure of fp32's
        ulp = max(NARROW_UNIT.get(d, U32) for _, d in narrowed)
        moved, moved_p, _ = torch_local(get(t64), call, inputs, grads64, torch.float64, moved=2 * ulp)
        cond_in = [m - b for m, b in zip(moved, g64)]
        cond_p = {n: moved_p[n] - p64[n] for n in p64}
        said = (f"torch's float64 reference narrows to {', '.join(sorted({d for _, d in narrowed}))} in "
                f"{', '.join(op for op, _ in narrowed[:3])}: budget from its change under inputs moved by one unit "
                "in the last place of that format; ")
    return TorchLocal(unit, inputs, g32, p32, g64, p64, gf, pf, cond_in, cond_p, said)


def layer_rows(session: TrainSession, half: TorchLocal, player, layer64, p_call) -> tuple[list, dict | None, list]:
    """(the rows of one unit's local backward, from torch's half and paddle's layer; paddle's own error
    per parameter where it was measured, else None; the measurements skipped). `layer64(path)`: the
    float64 copy's layer, or None."""
    unit, inputs = half.unit, half.inputs
    call, ppath, label = unit.call, unit.ppath, unit.label
    p_grads64 = [g.double().cpu() if g is not None else None for g in unit.p_grads]
    try:
        forced = paddle_call(call, p_call)
        gp, pp, forward = paddle_local(player, forced, inputs, unit.p_grads)
        forward = unit.reading(forward)
    except WrongCotangent:
        raise
    except Unpaired as exc:
        return [_left_out(unit, f"left out of the per-layer backward: {exc} (its parameters' end-to-end gradients "
                                "are compared)")], None, []
    except Exception as exc:  # a layer that cannot be re-run alone on torch's inputs is left out, said so
        skipped = Skipped.of(f"the local backward of '{label}'", exc)
        return [_left_out(unit, f"not re-run alone ({skipped.why})")], None, [skipped]
    agrees = all(_same_values(a, torch_side.to_numpy(o)) for a, o in zip(forward, call.outputs))
    note = half.said + LOCAL + label + ("" if agrees else FORWARD_DIFFERS)

    # what each row compares, its note with it: (torch name, paddle name, torch's gradient, paddle's, torch's
    # error, its error in paddle's format, note, condition, where paddle's own error is found), made once
    compared = []
    for i, (a, b, c) in enumerate(zip(half.g32, half.g64, gp)):
        if c is None:
            continue  # an input paddle's call does not take
        compared.append((f"{label} d input[{i}]", f"{ppath or '<model>'} d input[{i}]", a, c, (a - b).astype(np.float32),
                         None if half.gf is None else half.gf[i] - b, gradient_note(a, c) + note, half.cond_in[i],
                         ("in", i)))
    for pair in session.pairs:
        names = [unit.local(t) for t in pair.torch]
        local = relative(pair.paddle, ppath)
        if local not in pp or not all(n in half.p32 for n in names):
            continue
        want, ref = _in_paddle(pair, names, half.p32), _in_paddle(pair, names, half.p64)
        fmt_err = None if half.pf is None else _in_paddle(pair, names, half.pf) - ref
        condition = _in_paddle(pair, names, half.cond_p) if half.cond_p else None
        compared.append((pair.torch_name, pair.paddle, want, pp[local], (want - ref).astype(np.float32), fmt_err,
                         gradient_note(want, pp[local]) + note, condition, ("p", local)))

    def judged(own: dict) -> list:
        return [judge("backward", 0, t, p, want, got, e_ref, formats=session.formats, fmt_err=fmt_err, note=said,
                      e_other=own.get(key), condition=condition)
                for t, p, want, got, e_ref, fmt_err, said, condition, key in compared]

    rows = judged({})
    # a row not judged on torch's error alone may be with paddle's: it counts as past the rule's share
    if not measures_own_error(BACKWARD, [math.inf if r.ratio is None else r.ratio for r in rows]):
        return rows, None, []
    own_in, own_p, skip = paddle_own(layer64 and layer64(ppath), forced, inputs, p_grads64, gp, pp,
                                     ppath or "<model>")
    own = {("in", i): e for i, e in enumerate(own_in)}
    own.update((("p", n), e) for n, e in own_p.items())
    return judged(own), own_p, [skip] if skip is not None else []


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
