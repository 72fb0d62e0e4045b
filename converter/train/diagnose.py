"""Why the first culprit differs, by what-ifs wherever possible: torch's computation re-run with
one setting changed to what paddle's side has; the change that lands on paddle's result within
budget is the cause."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..diagnosis import Diagnosis as D  # the forward check's: a layer (or parameter), a cause, a hint
from ..diagnosis import confirmed_cause, went
from .loop import RunRecord
from .loss import LossProbe
from .optimizer import subclass_note, torch_class
from .optimizer_check import OptimizerCheck
from .result import FORWARD_DIFFERS, ZERO, layer_of, scale_in
from .session import TrainSession
from .steps import loss_band


@dataclass(frozen=True)
class Runs:
    """What the training checks ran, for the what-ifs: torch in fp32 and in float64, torch in
    paddle's matmul format (None where that is torch's), paddle, the loss probe on the first batch,
    the teacher-forced optimizer check, and the per-layer backward (its torch half) with the layers'
    pairs."""

    t32: RunRecord
    t64: RunRecord
    tfmt: RunRecord | None
    paddle: RunRecord
    loss: LossProbe
    optimizer_check: OptimizerCheck
    local: object
    pairs: object


def diagnose(session: TrainSession, tspec, rows: list, fb, runs: Runs) -> list:
    """Why `fb`, the first row over budget among `rows` (None: none is), differs, and how much of the
    loss drift paddle's matmul format explains."""
    out = []
    if fb is not None:
        handler = {"structure": _structure, "loss": _loss, "backward": _backward, "lr": _lr,
                   "optimizer": _optimizer, "steps": _steps}[fb.phase]
        found = handler(session, tspec, rows, fb, runs)
        out += found or [D(fb.torch, f"{fb.phase} differs beyond its budget (ratio {fb.ratio:.3g}); no what-if "
                           "reproduced it", _HINTS[fb.phase], kind="unexplained")]
    noise = _format_noise(session, runs)
    if noise is not None:
        out.append(noise)
    return out


_HINTS = {
    "structure": "make the parameter's trainable flag and optimizer membership the same on both sides",
    "loss": "compare reduction, ignore_index, label smoothing, class weights, soft labels and the class axis",
    "backward": "compare the layer's backward: a detach/stop_gradient, a custom PyLayer, an in-place op",
    "lr": "compare the schedule's parameters (warmup, T_max, gamma, milestones) and when it steps",
    "optimizer": "compare lr, betas, epsilon, weight decay (L2 vs decoupled), momentum, nesterov and clipping",
    "steps": "the per-step checks agree: compare what the steps leave outside the optimizer (buffers, BatchNorm)",
}


# structure ------------------------------------------------------------------------------------
def _structure(session: TrainSession, tspec, rows: list, fb, runs: Runs):
    hints = {"trainable": "set stop_gradient (trainable) on paddle's parameter as requires_grad is in torch",
             "missing": "pass every trainable parameter to paddle's optimizer (parameters=model.parameters())",
             "tied": "share the weight in paddle (assign the same Parameter to both layers)",
             "dropout": "give paddle's layer torch's dropout rate (a Dropout's p, an attention's dropout, the config's "
                        "dropout fields)"}
    key = next((k for k in hints if k in fb.note), "trainable")
    return [D(fb.torch, f"{fb.note}: torch '{fb.torch}', paddle '{fb.paddle}'", hints[key], kind=key)]


# loss ----------------------------------------------------------------------------------------
def _loss(session: TrainSession, tspec, rows: list, fb, runs: Runs):
    p = runs.loss
    lt, lp = p.loss_torch, p.loss_paddle
    if not math.isfinite(lp) and math.isfinite(lt):
        return [D("loss", f"paddle's loss is {lp} on torch's outputs and targets, torch's {lt:.7g}: paddle_loss "
                  "overflows or divides by zero (a log of 0, a softmax taken by hand, a mask of -inf)",
                  "compute paddle's loss as torch's does (paddle.nn.functional.cross_entropy on the logits rather "
                  "than log(softmax))", kind="loss overflow")]
    out = _cross_entropy_whatifs(p)
    if out:
        return out
    n = int(np.size(p.target)) if p.target is not None and not isinstance(p.target, (dict, tuple)) else 0
    total = sum(o.size for o in p.outputs)
    for count in {c for c in (n, total, p.outputs[0].shape[0] if p.outputs[0].ndim else 0) if c > 1}:
        if math.isclose(lp, lt * count, rel_tol=1e-5, abs_tol=1e-17):
            return [D("loss", f"paddle's loss is torch's times {count}: reduction 'sum' against 'mean'",
                      "use the same reduction on both sides (paddle: reduction='mean')", kind="loss reduction")]
        if math.isclose(lp * count, lt, rel_tol=1e-5, abs_tol=1e-17):
            return [D("loss", f"paddle's loss is torch's divided by {count}: reduction 'mean' against 'sum'",
                      "use the same reduction on both sides", kind="loss reduction")]
    return []


def _cross_entropy_whatifs(p):
    """Torch's cross-entropy re-run with one setting changed, on the same logits and targets: the
    output the loss reads (a causal LM's logits beside its key/value cache)."""
    from .ce_whatif import Side, explain, read_output, what_if
    i = read_output(p.grads_torch64, p.grads_paddle)
    if i is None or not isinstance(p.target, np.ndarray) or p.outputs[i].ndim < 2:
        return []
    logits = p.outputs[i].astype(np.float64)
    found = what_if(logits, p.target, Side(p.loss_torch64, p.grads_torch64[i]),
                    Side(p.loss_paddle, p.grads_paddle[i].astype(np.float64)))
    if found is None:
        return []
    what, base, changed, gradient = found
    cause, hint = explain(what, base, changed, logits.shape, gradient, p.target)
    return [D("loss", cause, hint, kind="cross entropy")]


# backward ------------------------------------------------------------------------------------
def _backward(session: TrainSession, tspec, rows: list, fb, runs: Runs):
    layer = layer_of(fb) or fb.torch
    rows = [r for r in rows if r.phase == "backward" and (layer_of(r) == layer or r is fb)]
    factor = scale_in(fb)
    if factor is not None:  # the culprit's own gradient, scaled: whatever else the layer's rows show
        where = f"the backward of '{fb.paddle.split(' ')[0]}'"
        return [D(layer, f"paddle's gradient of '{fb.paddle}' is torch's times {factor}: a custom backward (PyLayer) "
                  f"or a gradient hook in {where} that scales the gradient it passes on",
                  f"check {where} against autograd (paddle.autograd.PyLayer.backward, register_hook): it "
                  f"multiplies by {factor}", kind="custom backward")]
    zero = sorted((r for r in rows if r.bad and ZERO in r.note), key=lambda r: r is not fb)  # the culprit's first
    if zero:
        return [D(layer, f"the gradient is stopped on paddle's side: paddle's gradient of '{zero[0].paddle}' is zero "
                  "where torch's is not", "look for detach(), stop_gradient=True or a no_grad block in paddle's "
                  f"forward of '{fb.paddle.split(' ')[0]}'", kind="stopped gradient")]
    where = layer_of(fb)
    if not where:
        return []
    from .backward_whatif import setting_causes
    from .custom_backward import custom_backwards
    found = setting_causes(session, runs.local, runs.pairs, fb)
    if found or fb.note.endswith(FORWARD_DIFFERS):
        return found
    custom, ratio = custom_backwards(session, runs.local, fb)
    if custom and ratio is not None and ratio <= 1:  # its forward under autograd gives torch's gradient
        return [D(layer, confirmed_cause(f"paddle's backward of '{where}' differs from torch's while its forward "
                                         f"agrees, and its gradient runs through the custom backward "
                                         f"{', '.join(custom)} (paddle.autograd.PyLayer)", "its backward re-run on "
                                         "torch's recorded inputs and output gradient", f"{', '.join(custom)} "
                                         "differentiated by autograd from its forward", "gives torch's gradient",
                                         went(fb.ratio, ratio)),
                  f"check {custom[0]}.backward against the gradient of its forward (paddle.grad on the same ops, "
                  "or torch's autograd)", kind="custom backward")]
    return [D(layer, f"paddle's backward of '{where}' differs from torch's on torch's recorded inputs and output "
              "gradient while its forward agrees; no setting of the layer re-run with torch's value reproduces "
              "torch's gradient", f"compare how paddle's '{where}' computes its gradient with torch's "
              f"'{layer}' (the ops in its forward, and any gradient it sets by hand)", kind="backward")]


# learning rate -------------------------------------------------------------------------------
def _lr(session: TrainSession, tspec, rows: list, fb, runs: Runs):
    t, p = np.array(runs.t32.lrs), np.array(runs.paddle.lrs)
    k = fb.step
    same = lambda a, b: np.allclose(a, b, rtol=1e-6, atol=1e-15)
    moves = lambda a: int(np.argmax(~np.isclose(a, a[0], rtol=1e-6, atol=1e-15)))  # the first step it changed
    if same(p, p[0]) and not same(t, t[0]):
        return [D("lr", f"paddle's learning rate stays at {p[0]:.6g} while torch's changes from step {moves(t)}: "
                  "paddle's optimizer has no scheduler, or it is never stepped", "give paddle's optimizer the "
                  "scheduler torch's has (learning_rate=scheduler) and step it after every optimizer.step()", kind="no scheduler")]
    if same(t, t[0]) and not same(p, p[0]):
        return [D("lr", f"torch's learning rate stays at {t[0]:.6g} while paddle's changes from step {moves(p)}: a "
                  "scheduler on paddle's side only", "drop paddle's scheduler, or give torch's optimizer the same one",
                  kind="scheduler on one side")]
    if len(t) > 2 and same(p[1:], t[:-1]):
        return [D("lr", f"paddle's learning rates are torch's one step late (from step {k}): paddle's scheduler is "
                  "stepped once less (not after the first step, or its count starts one behind torch's)",
                  "step paddle's scheduler once after every optimizer.step(), as torch's", kind="scheduler step")]
    if len(t) > 2 and same(p[:-1], t[1:]):
        return [D("lr", f"paddle's learning rates are torch's one step early (from step {k})",
                  "step paddle's scheduler after optimizer.step(), and not before the first step", kind="scheduler step")]
    for period in range(2, len(t) + 1):
        stretched = t[np.arange(len(t)) // period]
        if same(p, stretched) and not same(p, t):
            return [D("lr", f"paddle's schedule advances once every {period} steps where torch's advances every "
                      "step: stepped per epoch against per step", "step both schedulers at the same time "
                      "(per step, or per epoch on both)", kind="scheduler period")]
    t_peak = int(np.argmax(t)) if len(t) else 0
    p_peak = int(np.argmax(p)) if len(p) else 0
    if t_peak != p_peak and (t_peak > 0 or p_peak > 0):
        return [D("lr", f"the warmup differs: torch's learning rate peaks at step {t_peak}, paddle's at step "
                  f"{p_peak} (step {k}: torch {t[k]:.6g}, paddle {p[k]:.6g})", _WARMUP_HINT, kind="warmup")]
    if k < max(_rises(t), _rises(p)):  # they part while a rate still rises from its start: in the warmup
        peak = _base_lr(runs)
        if peak is None and _rises(t) < len(t) - 1:  # torch's warmup ends within the steps
            peak = float(t[_rises(t)])
        return [D("lr", f"the warmup differs from step {k}: torch's learning rate rises {_ramp(t, peak)}, paddle's "
                  f"{_ramp(p, peak)}", _WARMUP_HINT, kind="warmup")]
    return [D("lr", f"the learning rates differ from step {k}: torch {t[k]:.6g}, paddle {p[k]:.6g}",
              _HINTS["lr"], kind="lr")]


_WARMUP_HINT = "give paddle's LinearWarmup torch's warmup length and start factor"


def _base_lr(runs) -> float | None:
    """The learning rate torch's scheduler starts from (its warmup's end): torch's first parameter
    group's initial_lr, which a torch scheduler sets; None without one."""
    groups = getattr(getattr(runs.optimizer_check, "ref_opt", None), "param_groups", None) or [{}]
    value = groups[0].get("initial_lr")
    return None if value is None else float(value)


def _rises(lr) -> int:
    """How many steps the learning rate rises from step 0 (a warmup, as far as the steps show it)."""
    falls = np.flatnonzero(np.diff(lr) <= 1e-6 * float(np.max(np.abs(lr), initial=0)))
    return int(falls[0]) if falls.size else len(lr) - 1


def _ramp(lr, peak: float | None) -> str:
    """How a learning rate starts: its first value and its first rise; for a linear rise, the step it
    reaches `peak` at (torch's warmup's end)."""
    rise = float(lr[1] - lr[0]) if len(lr) > 1 else 0.0
    said = f"from {lr[0]:.6g} by {rise:.6g} a step"
    n = _rises(lr)
    if peak is None or rise <= 0 or not np.allclose(np.diff(lr[:n + 1]), rise, rtol=1e-4, atol=0):
        return said
    return f"{said} (a linear warmup reaching {peak:.6g} at step {(peak - lr[0]) / rise:.3g})"


# optimizer -----------------------------------------------------------------------------------
def torch_settings_of(popt, param, lr: float) -> dict:
    """Paddle's optimizer in torch's terms for `param`: the torch class and hyperparameters that would do
    the same (those of its parameter group, its own L2 decay, and its rate: `lr` times its factor)."""
    kind = type(popt).__name__
    group = _paddle_group(popt, param)
    if group is not None:
        popt._update_param_group(group)  # the group's settings, as paddle sets them before the group's step
    reg = getattr(param, "regularizer", None) or getattr(popt, "regularization", None)
    l2 = float(getattr(reg, "_coeff", 0.0) or 0.0) if reg is not None else float(getattr(
        popt, "_regularization_coeff", 0.0) or 0.0)
    clip = getattr(popt, "_grad_clip", None)
    clip_kind = None if clip is None else type(clip).__name__
    out = {"clip": (clip_kind, float(getattr(clip, "clip_norm", getattr(clip, "max", 0.0)) or 0.0)) if clip else None}
    factor = float((getattr(param, "optimize_attr", None) or {}).get("learning_rate", 1.0))
    out["lr"], out["lr_factor"] = lr * factor, factor
    if kind in ("Adam", "AdamW"):
        decoupled = float(getattr(popt, "_weight_decay", 0.0) or 0.0) if kind == "AdamW" else 0.0
        out.update({"class": "AdamW" if kind == "AdamW" else "Adam", "betas": (float(popt._beta1), float(popt._beta2)),
                    "eps": float(popt._epsilon), "weight_decay": decoupled if kind == "AdamW" else l2})
    elif kind == "Momentum":  # paddle's Momentum has no dampening
        out.update({"class": "SGD", "momentum": float(popt._momentum), "nesterov": bool(popt._use_nesterov),
                    "dampening": 0.0, "weight_decay": l2})
    elif kind == "SGD":
        out.update({"class": "SGD", "momentum": 0.0, "dampening": 0.0, "weight_decay": l2})
    elif kind == "RMSProp":
        out.update({"class": "RMSprop", "alpha": float(popt._rho), "eps": float(popt._epsilon),
                    "momentum": float(popt._momentum), "centered": bool(popt._centered), "weight_decay": l2})
    elif kind == "Adagrad":
        out.update({"class": "Adagrad", "eps": float(popt._epsilon), "weight_decay": l2})
    elif kind == "Adamax":
        out.update({"class": "Adamax", "betas": (float(popt._beta1), float(popt._beta2)), "eps": float(popt._epsilon),
                    "weight_decay": l2})
    return out


def _paddle_group(popt, param):
    """The parameter group of paddle's optimizer holding `param`, or None (no groups)."""
    return next((g for g in getattr(popt, "_param_groups", None) or [] if isinstance(g, dict)
                 and any(p is param for p in g.get("params", []))), None)


_SETTINGS = ("betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "alpha", "centered")


def _torch_settings(opt, clip_norm, group: dict) -> dict:
    """Torch's optimizer for the parameters of `group` (one of its state dict's param_groups)."""
    name = torch_class(opt).__name__  # a subclass of one of torch's optimizers is re-run as that optimizer
    kind = "AdamW" if name == "Adam" and group.get("decoupled_weight_decay") else name
    out = {"class": kind, "clip": ("ClipGradByGlobalNorm", float(clip_norm)) if clip_norm else None,
           "lr": float(group["lr"])}
    for key in _SETTINGS:
        if key in group:
            out[key] = tuple(group[key]) if key == "betas" else group[key]
    return out


_WHAT = {
    "lr": "learning rate", "eps": "epsilon", "betas": "beta1/beta2", "weight_decay": "weight decay",
    "momentum": "momentum", "dampening": "dampening", "nesterov": "nesterov", "alpha": "RMSProp rho (torch alpha)",
    "centered": "centered",
    "clip": "gradient clipping", "class": "the optimizer's kind",
}
_OPTIMIZER_HINT = ("set paddle's optimizer as torch's (or drop paddle_optimizer from the spec and let --train translate "
                   "torch's; --emit-optimizer prints it)")


def _optimizer(session: TrainSession, tspec, rows: list, fb, runs: Runs):
    check = runs.optimizer_check
    pair = check.by_paddle.get(fb.paddle.split(" ")[0])
    if check.failed is None or pair is None:
        return []
    failed = check.failed
    group = _group_of(failed["before"]["state"]["param_groups"], failed["index"], pair.torch[0])
    torch_side = _torch_settings(check.ref_opt, tspec.clip_grad_norm, group)
    # the teacher-forced step ran at torch's base learning rate (the lr phase judges paddle's own)
    paddle_side = torch_settings_of(check.opt, check.params[pair.paddle], runs.t32.lrs[failed["step"]])
    keys = [k for k in paddle_side if k in torch_side and _differs(torch_side[k], paddle_side[k])]
    if torch_side["class"] != paddle_side.get("class") and paddle_side.get("class"):
        keys = ["class"] + [k for k in keys if k != "class"]
    if not keys:
        return _generated(check, pair, group, fb)
    tried = [(_what_if(check, pair, group, torch_side, {key: paddle_side[key]}, fb), [key]) for key in keys]
    if len(keys) > 1:  # settings that differ together (paddle's defaults are not torch's: RMSProp's rho and eps)
        tried.append((_what_if(check, pair, group, torch_side, {k: paddle_side[k] for k in keys}, fb), keys))
    tried = sorted((r, ks) for r, ks in tried if r is not None)
    differ = "; ".join(_cause(k, torch_side[k], paddle_side[k]) for k in keys)
    taken = "" if subclass_note(check.ref_opt) is None else f" ({subclass_note(check.ref_opt)})"
    if not tried or tried[0][0] > 1:  # no what-if of the settings named lands: those the optimizers keep
        found = _generated(check, pair, group, fb)
        if found:
            return found
    if not tried or tried[0][0] >= fb.ratio:  # no what-if comes nearer paddle's step than torch's own
        return [D(fb.torch, f"paddle's optimizer differs from torch's here: {differ}; torch's step with paddle's "
                  f"settings does not reproduce paddle's{taken}", _OPTIMIZER_HINT, kind="optimizer")]
    ratio, changed = tried[0]
    what = " and ".join(_WHAT[k] for k in changed)
    verdict = "reproduces paddle's step" if ratio <= 1 else f"comes closest to paddle's step (ratio {ratio:.3g})"
    cause = "; ".join(_cause(k, torch_side[k], paddle_side[k]) for k in changed)
    hint = _OPTIMIZER_HINT
    if "dampening" in changed:
        hint = "paddle's Momentum has no dampening: train torch without it (dampening=0), or write paddle's update"
    if "lr" in changed and paddle_side["lr_factor"] != 1.0:
        cause += (f" (paddle's rate times this parameter's learning-rate factor {paddle_side['lr_factor']:g}, from a "
                  "parameter group's 'learning_rate' or its ParamAttr(learning_rate=...))")
        hint = (f"give the parameter the factor {torch_side['lr'] / (paddle_side['lr'] / paddle_side['lr_factor']):g} "
                "of paddle's rate, as torch's parameter group has it")
    return [D(fb.torch, f"{cause}; torch's step with paddle's {what} {verdict}{taken}", hint, kind="optimizer")]


def _generated(check, pair, group: dict, fb) -> list:
    """The what-ifs over every setting the two optimizers keep (optimizer_whatif.py)."""
    from .optimizer_whatif import said, search
    cls = torch_class(check.ref_opt)
    hits = search(check, pair, group, cls, fb)
    if not hits:
        return []
    cause, hint = said(hits[0], cls.__name__, fb.ratio, check.opt)
    return [D(fb.torch, cause, hint, kind="optimizer")]


def _cause(key: str, t, p) -> str:
    if key == "class" and {t, p} == {"Adam", "AdamW"}:
        return (f"weight decay: torch's {t} decays {'decoupled from' if t == 'AdamW' else 'through'} the gradient, "
                f"paddle's {p} {'through the gradient (L2)' if p == 'Adam' else 'decoupled'}")
    return f"{_WHAT[key]}: torch {_show(t)}, paddle {_show(p)}"


def _group_of(groups: list, index: list, name: str) -> dict:
    """The group of torch's optimizer state dict holding parameter `name` (`index`: names by state index)."""
    position = index.index(name)
    return next((g for g in groups if position in g["params"]), groups[0])


def _show(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        return f"{v[0]}({v[1]:g})"
    return repr(v)


def _differs(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return any(_differs(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return not math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return True
    return a != b


def _what_if(check, pair, group: dict, torch_side: dict, change: dict, fb):
    """Torch's teacher-forced step with `change` applied to the settings of `pair`'s group
    (optimizer_whatif.teacher_forced)."""
    import inspect

    import torch

    from .optimizer_whatif import teacher_forced
    settings = dict(torch_side, **change)
    cls = getattr(torch.optim, settings["class"])
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: settings[k] for k in _SETTINGS if k in settings and k in accepted}
    if kwargs.get("nesterov") and (not kwargs.get("momentum") or kwargs.get("dampening")):
        kwargs["nesterov"] = False
    return teacher_forced(check, pair, fb, cls, settings.get("lr", group["lr"]), kwargs, settings.get("clip"))


# free-running steps --------------------------------------------------------------------------
def _steps(session: TrainSession, tspec, rows: list, fb, runs: Runs):
    from .steps import replay_running
    name = fb.torch
    if name.endswith(("running_mean", "running_var")):
        path = name.rpartition(".")[0]
        module = session.torch_model.get_submodule(path)
        layer = _paddle_layer(session, fb.paddle.rpartition(".")[0])
        m_torch, m_paddle = float(module.momentum), float(getattr(layer, "_momentum", float("nan")))
        run = runs.tfmt if runs.tfmt is not None else runs.t32  # the closest to paddle's arithmetic
        stats = run.bn_stats.get(path, [])
        which = 0 if name.endswith("running_mean") else 1
        initial = session.torch_init[name].cpu().numpy()
        got = runs.paddle.final[fb.paddle]
        what_if = float(np.max(np.abs(replay_running(initial, stats, which, m_paddle) - got), initial=0))
        expected = float(np.max(np.abs(replay_running(initial, stats, which, 1.0 - m_torch) - got), initial=0))
        if what_if <= 0.1 * expected:  # paddle's own momentum explains its statistics; the right one does not
            right = 1.0 - m_torch
            replayed = (f"torch's batch statistics replayed under paddle's rule with its momentum {m_paddle:g} end "
                        f"{what_if:.3g} from paddle's '{fb.paddle}', with {right:g} (1 - torch's) {expected:.3g}")
            pace = "far too fast" if m_paddle < right else "far too slowly"
            if math.isclose(m_paddle, m_torch, rel_tol=1e-6):
                return [D(path, f"BatchNorm momentum convention: paddle's momentum is {m_paddle:g}, torch's value "
                          f"left as is; paddle weighs the old statistic by momentum (torch by 1 - momentum), so at "
                          f"each step paddle's running statistics keep {m_paddle:g} of their value and take "
                          f"{1 - m_paddle:g} of the batch's (torch's keep {right:g}, take {m_torch:g}): they follow "
                          f"the batch {pace}; {replayed}", f"give paddle's BatchNorm momentum={right:g} (1 - torch's)",
                          kind="momentum")]
            return [D(path, f"BatchNorm momentum: paddle's {m_paddle:g} against {right:g} (1 - torch's "
                      f"{m_torch:g}): paddle's running statistics follow the batch {pace}; {replayed}",
                      f"give paddle's BatchNorm momentum={right:g}", kind="momentum")]
    if fb.torch == "loss":
        return [D("loss", f"the loss curves leave the noise band at step {fb.step} (ratio {fb.ratio:.3g}) though "
                  "every teacher-forced check is within budget", "compare what the steps do outside the checked "
                  "parts (data order, buffers, in-place updates)", kind="steps")]
    return []


def _paddle_layer(session: TrainSession, path: str):
    layer = session.paddle_model
    for part in filter(None, path.split(".")):
        layer = layer._sub_layers[part]
    return layer


def _format_noise(session: TrainSession, runs):
    """With paddle in another matmul format: how much of the loss drift that format explains."""
    fmt = session.formats.get("paddle")
    if fmt in (None, "fp32") or runs.tfmt is None:
        return None
    t32, t64, tfmt, p = runs.t32, runs.t64, runs.tfmt, runs.paddle
    conv = runs.optimizer_check.loss_drift
    band = loss_band(t32, t64, tfmt, conv)
    band32 = loss_band(t32, t64, None, conv)
    diffs = [abs(a - b) for a, b in zip(p.losses, t32.losses)]
    r_fmt = max(d / b for d, b in zip(diffs, band))
    r_32 = max(d / b for d, b in zip(diffs, band32))
    if r_fmt > 1:
        return None
    return D("<loss curve>", f"the loss curves differ by up to {max(diffs):.3g}: within the noise band of {fmt} "
             f"matmuls on paddle's side (ratio {r_fmt:.3g}), {r_32:.3g} times the fp32 band: {fmt} noise, not a bug",
             f"expected while paddle computes its matmuls in {fmt}; to compare in fp32, "
             + ("turn TF32 off (FLAGS_cublas_allow_tf32=0, or --precision strict)" if fmt == "tf32" else
                f"run paddle's model in float32 (no {fmt} cast, no AMP)"), kind=fmt)
