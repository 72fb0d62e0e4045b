"""The backward pass, layer by layer: each paired paddle layer's vector-Jacobian product on torch's
recorded inputs and torch's recorded output gradient (teacher forcing), against torch's own local
product, with a budget from the same product in float64 (and in the format a side uses).

Modules and layers pair as the forward check pairs them (pairing.py): the same path, the
conversion plan (a torch MultiheadAttention, whose fused in_proj_weight feeds paddle's q_proj, k_proj
and v_proj, with paddle's MultiHeadAttention), layers without weights of one kind in execution order
under one paired parent, and the models themselves. The torch modules one paddle layer fuses
(q|k|v, gate|up) are one unit (units.py), their input gradients summed. The paddle layer is called
as paddle's own forward called it (paddle_local.py); inputs that hold the same values are one input
on both sides, so (x, x, x) against (x,) compares the total gradient.
Each paddle parameter's gradient is compared with torch's through the conversion's own rules: the
slice of in_proj_weight the split gives q_proj.weight, transposed as its transpose rule says. The
culprit is read from the rows (backward_notes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..compare.capture import Recorder, record
from ..compare.precision import emulate_paddle_training, emulate_torch_training, remove
from ..frameworks import paddle_side, torch_side
from ..paths import relative
from .backward_notes import FORWARD_DIFFERS, LOCAL, gradient_note
from .judge import judge
from .loop import call_model, to_paddle, to_torch, torch_loss
from .paddle_local import Float64Layers, Unpaired, WrongCotangent, paddle_call, paddle_local, paddle_own
from .result import Row, Skipped
from .torch_local import TorchLocal, torch_half
from .units import Unit, outputs_handed_on

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from .pairing import LayerPairs
    from .session import TrainSession

FORWARD_AGREES = 1e-3  # the paddle layer's forward on torch's inputs, relative to the output's scale
# paddle's own error is measured for a layer with a row past this share of its budget on torch's
# error alone (its kernels may reduce in other orders); below it, torch's stands in, a budget no larger
OWN_FROM = 0.5


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
            torch_loss(tspec, out, to_torch(target, torch.float32, session.device), torch.float32).backward()
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
        players64 = Float64Layers(session) if self.fmt == "fp32" else None
        p_handles = emulate_paddle_training(self.fmt)
        rows, own, skipped = [], {}, list(self.skipped)
        try:
            for half in self.halves:
                if isinstance(half, Row):
                    rows.append(half)
                    continue
                ppath = half.unit.ppath
                found, measured, skips = _layer_rows(session, half, players[ppath], players64, self.p_calls.get(ppath))
                rows += found
                skipped += skips
                if measured is not None and not ppath:
                    own = dict(measured)
        finally:
            remove(p_handles)
        return LocalRows(rows, own, skipped + (players64.skipped if players64 is not None else []))


def _layer_rows(session: TrainSession, half: TorchLocal, player, players64, p_call) -> tuple[list, dict | None, list]:
    """(the rows of one unit's local backward, from torch's half and paddle's layer; paddle's own error
    per parameter where it was measured, else None; the measurements skipped). `players64`: the
    float64 copy's layers, or None."""
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
    if all(r.ratio is not None and r.ratio <= OWN_FROM for r in rows):  # torch's error alone covers it
        return rows, None, []
    own_in, own_p, skip = paddle_own(players64 and players64.get(ppath), forced, inputs, p_grads64, gp, pp,
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
