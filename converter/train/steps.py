"""N free-running steps on both sides, judged against a measured noise band.

The band is how far two legitimate torch runs drift apart under the arithmetic in use: torch in
fp32 against torch in float64, and, when a side computes its matmuls in another format (TF32,
bf16), torch in that format against float64. The loss band at step k is MARGIN times the largest
drift seen up to k, combined over the two sides; the final weights and BatchNorm running
statistics get per-element budgets from the same runs. Paddle's BatchNorm updates its running
variance with the biased batch variance (torch: unbiased), so the running statistics are replayed
from torch's batch statistics under paddle's rule."""

from __future__ import annotations

import math

import numpy as np

from ..compare.budget import MARGIN, tail
from ..compare.precision import U32
from ..paths import join
from .judge import judge, zero_note
from ..results import Skipped
from .result import LR_REL, Row, StepRow
from .session import TrainSession

BAND_MARGIN = tail(2) * MARGIN  # 5: the tolerance the forward budgets use on a few values


def loss_band(t32, t64, tfmt, conventions: list | None = None) -> list:
    """Per step: MARGIN x the largest drift so far of torch in fp32 (and in paddle's format) from
    float64, plus what the optimizer's conventions moved the loss by (first order)."""
    band, d32, dfmt = [], 0.0, 0.0
    for k, (a, b) in enumerate(zip(t32.losses, t64.losses)):
        d32 = max(d32, abs(a - b))
        dfmt = max(dfmt, abs(tfmt.losses[k] - b)) if tfmt is not None else d32
        conv = conventions[k] if conventions and k < len(conventions) else 0.0
        floor = 4 * U32 * abs(b)
        band.append(BAND_MARGIN * (math.sqrt(d32 * d32 + dfmt * dfmt) + conv) + floor)
    return band


def step_rows(t32, t64, tfmt, paddle, conventions: list | None = None) -> tuple[list, list, list]:
    """(StepRow per step, loss rows of phase steps, lr rows)."""
    band = loss_band(t32, t64, tfmt, conventions)
    steps, loss, lrs = [], [], []
    for k, b in enumerate(band):
        s = StepRow(k, t32.losses[k], paddle.losses[k], t32.lrs[k], paddle.lrs[k], b)
        steps.append(s)
        loss.append(Row("steps", k, "loss", "loss", s.ratio, abs(s.loss_paddle - s.loss_torch), b))
        lrs.append(Row("lr", k, "lr", "lr", s.lr_ratio, abs(s.lr_paddle - s.lr_torch), LR_REL * abs(s.lr_torch) + 1e-15))
    return steps, loss, lrs


def replay_running(initial: np.ndarray, stats: list, which: int, paddle_momentum: float) -> np.ndarray:
    """A running statistic under paddle's rule: r = m r + (1 - m) batch (the variance biased)."""
    r = initial.astype(np.float64)
    for s in stats:
        r = paddle_momentum * r + (1.0 - paddle_momentum) * s[which]
    return r


def running_stats(session: TrainSession, record) -> dict:
    """torch buffer name -> its value replayed under paddle's rule with torch's momentum."""
    out = {}
    for path, stats in record.bn_stats.items():
        m = getattr(session.torch_model.get_submodule(path), "momentum", None)
        if m is None:
            continue
        for which, buf in ((0, "running_mean"), (1, "running_var")):
            name = join(path, buf)
            out[name] = replay_running(session.torch_init[name].cpu().numpy(), stats, which, 1.0 - m)
    return out


PADDLE_DRIFT = "budgeted with paddle's own drift from float64, measured on a float64 run of the paddle model"


def final_rows(session: TrainSession, t32, t64, tfmt, paddle, drift: dict, paddle_drift: dict | None = None) -> list:
    """The final weights and buffers, per tensor, in paddle's layout; `drift` is what the optimizer's
    conventions (float32 betas, clipping's + 1e-6) moved each weight by over the steps, added to its
    budget; `paddle_drift` (see paddle_own_drift), per paddle tensor, paddle's own drift from float64
    over the steps, where it was measured (torch's stands in for it otherwise)."""
    fmt = session.formats.get("paddle")
    replay = {tag: running_stats(session, r) for tag, r in (("32", t32), ("64", t64), ("fmt", tfmt)) if r is not None}
    rows = []
    for pair in session.pairs:
        if pair.paddle not in paddle.final:
            continue
        sources = [_final(pair, r, replay[tag]) for tag, r in (("32", t32), ("64", t64), ("fmt", tfmt))
                   if r is not None]
        if any(s is None for s in sources):
            continue
        want, ref = sources[0].astype(np.float32), sources[1]
        fmt_err = sources[2] - ref if tfmt is not None and fmt not in (None, "fp32") else None
        e_ref = (sources[0] - ref).astype(np.float32)
        replayed = any(t in replay["32"] for t in pair.torch)
        note = "replayed under paddle's rule (biased batch variance)" if replayed else ""
        own = (paddle_drift or {}).get(pair.paddle)
        if own is not None:
            note = "; ".join(filter(None, (note, PADDLE_DRIFT)))
        # one drift sample per element is a weak estimate after many chaotic steps: the tensor's
        # largest drift is every element's floor (a band per tensor)
        floor = np.sqrt(float(np.max(np.abs(e_ref), initial=0.0)) ** 2 + np.square(drift.get(pair.paddle, 0.0)))
        rows.append(judge("steps", len(t32.losses), pair.torch_name, pair.paddle, want, paddle.final[pair.paddle],
                          e_ref, floor, formats=session.formats, fmt_err=fmt_err, note=note, e_other=own))
    return rows


def paddle_own_drift(session: TrainSession, tspec, batches, paddle) -> tuple[dict | None, list]:
    """(per paddle tensor, how far paddle's fp32 run (`paddle`'s record) ended from a float64 run of the
    paddle model on the same batches (casts to float32 inside kept in float64): its kernels' own drift,
    which a few steps of an adaptive optimizer amplify, and which is larger than torch's where they sum
    less exactly (AMD EPYC, AVX2: a clean Llama's gate_proj 1.3 times a budget taken from torch's drift
    after 3 AdamW steps); the measurements skipped). None where the paddle model does not train in
    float64 (skipped) or its side computes in another format (whose own runs give its budget)."""
    from ..compare.forced import _paddle_keeps_float64
    from .loop import call_model, paddle_loss, paddle_optimizer, to_paddle
    if session.formats.get("paddle") not in (None, "fp32"):
        return None, []
    model = session.paddle_copy()
    try:
        model.to(dtype="float64")
        opt, sched = paddle_optimizer(session, tspec, model)
        with _paddle_keeps_float64(("float32",)):
            for inputs, target in batches:
                loss = paddle_loss(tspec, call_model(model, to_paddle(inputs, np.float64)), to_paddle(target, np.float64))
                loss.backward()
                opt.step()
                opt.clear_grad()
                if sched is not None:
                    sched.step()
        final = {n: np.array(t.numpy()) for n, t in model.state_dict().items()}
    except Exception as exc:  # a model or loss that does not train in float64: nothing measured, said so
        return None, [Skipped.of("paddle's own drift on a float64 run of paddle_model() (torch's drift stands in "
                                 "for it)", exc)]
    out = {}
    for name, value64 in final.items():
        got = paddle.final.get(name)
        if got is None or not np.issubdtype(got.dtype, np.floating):
            continue
        if value64.dtype != np.float64:
            return None, []  # it computed in float32 inside
        out[name] = np.subtract(got, value64, dtype=np.float64).astype(np.float32)
    return out, []


def _final(pair, record, replayed: dict):
    arrays = {}
    for t in pair.torch:
        if t in replayed:
            arrays[t] = replayed[t]
        elif t in record.final:
            arrays[t] = record.final[t].astype(np.float64)
        else:
            return None
    if not all(np.issubdtype(a.dtype, np.floating) for a in arrays.values()):
        return None
    return pair.to_paddle(arrays)


def grad_rows(session: TrainSession, t32, t64, tfmt, paddle, paddle_own: dict) -> list:
    """Every parameter's end-to-end gradient at the first step; paddle's own error in it (`paddle_own`,
    per paddle parameter) is the one the per-layer backward measured for the whole model on the same
    batch, where it did (torch's error stands in for it otherwise)."""
    fmt = session.formats.get("paddle")
    rows = []
    for pair in session.pairs:
        if pair.paddle not in paddle.grads0 or not all(t in t32.grads0 for t in pair.torch):
            continue
        want = pair.to_paddle(t32.grads0)
        ref = pair.to_paddle({t: t64.grads0[t] for t in pair.torch})
        fmt_err = pair.to_paddle(tfmt.grads0) - ref if tfmt is not None and fmt not in (None, "fp32") else None
        got = paddle.grads0[pair.paddle]
        rows.append(judge("backward", 0, pair.torch_name, pair.paddle, want, got, (want - ref).astype(np.float32),
                          formats=session.formats, fmt_err=fmt_err, note=zero_note(want, got) + "end-to-end gradient",
                          e_other=paddle_own.get(pair.paddle)))
    return rows
