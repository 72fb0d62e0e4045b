"""verify-port --train end to end: the phases, the first culprit, its diagnosis, the TrainReport."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from .. import progress
from ..errors import UserError
from ..frameworks import torch_side
from ..spec import DEFAULT_STEPS
from .loop import call_model, float_outputs, paddle_run, spec_errors, to_torch, torch_run
from .optimizer import translate
from ..results import skipped_notes
from .result import PHASES, TrainReport, culprit
from .session import TrainSession
from ..compare.overlap import TorchWorker
from ..compare.session import PortSession, _float64_by_default
from .spec import TrainSpec


# what paddle says on every training-mode call and that is no finding of ours: BatchNorm layers
# warn that they track the running statistics in training (they always have: the check compares them)
PADDLE_TRAINING_NOTICES = (r"When training, we now always track global mean and variance",)


@contextlib.contextmanager
def paddle_notices_silenced():
    """Paddle's training-mode notices (PADDLE_TRAINING_NOTICES) left out of our output; the warning
    filters are put back on exit."""
    with warnings.catch_warnings():
        for message in PADDLE_TRAINING_NOTICES:
            warnings.filterwarnings("ignore", message=message, category=UserWarning, module=r"paddle(\.|$)")
        yield


def first_bad(rows: list):
    """The culprit: the first row over budget in the earliest phase failing beyond the budget's margin
    (each phase is judged on its own teacher-forced inputs, so a marginal row in an earlier phase does
    not hide a clear failure in a later one); where every failure is marginal, the earliest."""
    found = _first_in_phases([r for r in rows if r.clearly_bad])
    return found if found is not None else _first_in_phases([r for r in rows if r.bad])


def _first_in_phases(bad: list):
    for phase in PHASES:
        found = culprit(bad) if phase == "backward" else next((r for r in bad if r.phase == phase), None)
        if found is not None:
            return found
    return None


def translation_of(spec):
    """Torch's optimizer of `spec` (on its torch model) translated to paddle's, as --emit-optimizer
    writes it; asked before any check runs. UserError where it has no translation."""
    tspec = TrainSpec(spec)
    opt, sched = tspec.torch_optimizer(spec.torch_model())
    try:
        return translate(opt, sched, tspec.clip_grad_norm)
    except UserError as exc:
        if not tspec.has["paddle_optimizer"]:
            raise
        raise UserError(f"--emit-optimizer: {str(exc).partition(';')[0]}, and the spec gives paddle_optimizer(model) "
                        "itself: there is nothing to write; drop --emit-optimizer") from None


def _check_deterministic(session: TrainSession, tspec, batch) -> None:
    import torch
    model = session.run_only_copy("torch")
    inputs = to_torch(batch[0], torch.float32, session.device)
    with torch.no_grad(), spec_errors(tspec, "torch_model() in training mode"):
        torch.manual_seed(0)
        a = [torch_side.to_numpy(o) for o in float_outputs(call_model(model, inputs))]
        torch.manual_seed(1)
        b = [torch_side.to_numpy(o) for o in float_outputs(call_model(model, inputs))]
    if any(not np.array_equal(x, y) for x, y in zip(a, b)):
        raise UserError(f"torch_model() from '{tspec.path}' gives different outputs on the same batch in training "
                        "mode with every dropout module at 0: it draws random numbers in its forward (functional "
                        "dropout?); training checks need a deterministic forward, so make that probability 0")


def train_on(port: PortSession, tspec: TrainSpec, steps: int = DEFAULT_STEPS) -> TrainReport:
    """The training checks of `tspec` (the training side of port's spec) on the models of `port`, as
    converted and set up for the forward check, which takes them back as it had them."""
    if steps < 1:
        raise UserError(f"--steps must be at least 1; got {steps}")
    with paddle_notices_silenced(), port.training():
        batches = tspec.batches(steps)
        if not any(p.requires_grad for p in port.torch_model.parameters()):
            raise UserError(f"torch_model() from '{tspec.path}' has no trainable parameter (requires_grad is False "
                            "on every one): --train has nothing to check; unfreeze the parameters the port trains")
        session = TrainSession(port, tspec)
        try:
            return _train_check(session, tspec, batches, steps)
        finally:
            session.restore()


def _train_check(session: TrainSession, tspec: TrainSpec, batches: list, steps: int) -> TrainReport:
    from .backward import LocalBackward, pair_layers
    from .diagnose import Runs, diagnose
    from .loss import loss_rows, probe
    from .optimizer_check import OptimizerCheck
    from .steps import final_rows, grad_rows, paddle_own_drift, step_rows
    from .structure import structure_rows

    _check_deterministic(session, tspec, batches[0])
    check = OptimizerCheck(session, tspec, steps)
    pairs = pair_layers(session)
    rows = structure_rows(session, pairs, session.torch_optimizer, (check.model, check.opt))
    loss_probe = probe(session, tspec, batches[0])
    rows += loss_rows(loss_probe)
    local = LocalBackward(session, tspec, batches[0], pairs)  # torch's half of the per-layer backward
    session.done_with_run_only("torch")  # the fp32 run below trains it
    fmt_t, fmt_p = session.formats["torch"], session.formats["paddle"]
    t32 = torch_run(session, tspec, batches, None, fmt_t, on_step=check)
    tfmt = torch_run(session, tspec, batches, None, fmt_p) if fmt_p != fmt_t else None

    def paddle_side():  # paddle's half of the per-layer backward, then paddle's run on that copy
        local_rows = local.rows()
        session.done_with_run_only("paddle")
        return local_rows, paddle_run(session, tspec, batches, fmt_p)
    t64, (backward, p) = _float64_beside(session, tspec, batches, paddle_side)
    rows += backward.rows
    step_table, loss_steps, lr_rows = step_rows(t32, t64, tfmt, p, check.loss_drift)
    rows += grad_rows(session, t32, t64, tfmt, p, backward.paddle_own) + lr_rows + check.rows + loss_steps
    final, skipped = final_rows(session, t32, t64, tfmt, p, check.drift), list(backward.skipped)
    if any(not row.ratio <= 1 for row in final):  # the budget took paddle's drift to be torch's: measure its own
        own, skip = paddle_own_drift(session, tspec, batches, p)
        skipped += skip
        if own is not None:
            final = final_rows(session, t32, t64, tfmt, p, check.drift, own)
    rows += final
    bad = first_bad(rows)
    notes = _notes(session, tspec) + conventions(session, tspec, rows, check) + skipped_notes(skipped)
    described = ("the spec's paddle_optimizer(model)" if tspec.has["paddle_optimizer"] else
                 "translated from torch's: " + session.translation.describe())
    code = None if session.translation is None else session.translation.code()
    diagnosis = diagnose(session, tspec, rows, bad, Runs(t32, t64, tfmt, p, loss_probe, check, local, pairs))
    progress.training_done()
    return TrainReport(rows, step_table, bad, diagnosis, notes, described, dict(session.formats), code)


def _float64_beside(session: TrainSession, tspec, batches, paddle_side) -> tuple:
    """(torch's float64 run, paddle_side()): the torch run on the worker thread while `paddle_side`,
    paddle's and numpy's work, runs here (paddle computes on one core on CPU; compare/overlap.py), in
    turn in serial mode. The float64 run makes what the forward makes in the default dtype float64
    too (HF's masks), a setting of the whole process: nothing here makes a torch tensor in the default
    dtype meanwhile.
    Torch's error is raised first, as in turn."""
    def float64_run():
        import torch
        with _float64_by_default():
            return torch_run(session, tspec, batches, torch.float64)
    with TorchWorker(session.port) as side:
        t64 = side.submit(float64_run)
        try:
            here = paddle_side()
        finally:
            t64 = t64.result()
    return t64, here


def conventions(session: TrainSession, tspec, rows, check) -> list:
    """The conventions that differ between the two libraries, are not bugs of the port, and were
    budgeted or replayed (each said once, in the notes the terminal prints): BatchNorm's running
    variance updated with the biased batch variance on paddle's side, the optimizer's (an update rule
    of paddle's own where the teacher-forced steps measured it beyond fp32's rounding), and those a
    paddle loss says it evens out (its `convention`: the directories' causal-LM loss, see hf.pair)."""
    from ..compare.precision import U32
    from ..compare.upstream import ADAMAX_EPSILON, BATCHNORM_VARIANCE
    said = []
    variances = [r.paddle for r in rows if r.phase == "steps" and "biased batch variance" in r.note
                 and "var" in f"{r.paddle} {r.torch}".lower()]
    if variances:
        shown = ", ".join(f"'{v}'" for v in variances[:3]) + (f" and {len(variances) - 3} more" if len(variances) > 3 else "")
        said.append(f"convention: {BATCHNORM_VARIANCE.line()}; torch's batch statistics were replayed under "
                    f"paddle's rule for {shown}: not a bug of the port")
    if session.translation is not None:
        said += [f"convention: {note}" for note in session.translation.notes if note.startswith("paddle")]
    if type(check.opt).__name__ == "Adamax" and check.rule_gap > U32:
        said.append(f"convention: {ADAMAX_EPSILON.line()}; on torch's steps here it changes a step by at most "
                    f"{check.rule_gap:.3g} relative (epsilon over the norm), taken into the optimizer's budget: not a bug of "
                    "the port")
    loss = getattr(tspec.spec.training_part("paddle_loss"), "convention", None)  # a loss that says what it evens out
    if isinstance(loss, str):
        said.append(f"convention: {loss}")
    return said


def _notes(session: TrainSession, tspec) -> list:
    nt, np_ = session.dropout.count
    notes = [f"dropout set to 0 on both sides for the training checks ({nt} torch module(s), {np_} paddle layer(s) "
             "had a non-zero probability)"]
    if not tspec.has["torch_loss"]:
        notes.append("no torch_loss/paddle_loss in the spec: the loss is a fixed random projection of the outputs")
    if not tspec.has["batches"]:
        notes.append("no batches() in the spec: every step trains on inputs()")
    for side, fmt in session.formats.items():
        if fmt != "fp32":
            notes.append(f"{side} computes its matmuls in {fmt}: the noise band includes a torch run in {fmt}")
    return notes
