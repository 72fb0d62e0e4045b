"""N training steps on one side, recording what the checks compare: the loss and learning rate of
each step, the first step's gradients, the final weights and buffers, and BatchNorm's batch
statistics (to replay the running statistics under either framework's rule)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .. import progress
from ..errors import UserError
from ..compare.model_errors import model_errors
from ..frameworks import paddle_side
from ..tree import flatten, is_float_tensor, is_paddle_tensor, map_leaves
from ..compare.precision import emulate_paddle_training, emulate_torch_training, remove
from .session import TrainSession, one_thread

TORCH_BATCHNORM = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")


@dataclass(frozen=True)
class RunRecord:
    losses: list  # per step
    lrs: list  # per step
    grads0: dict  # name -> first step's gradient
    final: dict  # name -> final array (parameters and buffers)
    bn_stats: dict  # torch path -> [(batch mean, biased batch variance)] (torch runs)


def _batch_leaf(value) -> bool:
    """The values of a spec's batch (inputs or target) that become one tensor each: everything but
    its dicts and tuples (an array, a list of numbers, a scalar, None)."""
    return not isinstance(value, (dict, tuple))


def to_torch(value, dtype, device):
    """A batch's arrays as torch tensors on `device`, floating ones in `dtype`; None stays None."""
    import torch

    def tensor(leaf):
        if leaf is None:
            return None
        t = torch.from_numpy(np.array(leaf))
        return (t.to(dtype) if t.is_floating_point() else t).to(device)
    return map_leaves(value, tensor, _batch_leaf)


def to_paddle(value, dtype=np.float32):
    """A batch's arrays as paddle tensors, floating ones in `dtype` (float32 as torch's fp32 runs take
    them, to_torch); None stays None."""
    import paddle

    def tensor(leaf):
        if leaf is None:
            return None
        array = np.array(leaf)
        return paddle.to_tensor(array.astype(dtype) if np.issubdtype(array.dtype, np.floating) else array)
    return map_leaves(value, tensor, _batch_leaf)


def call_model(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


BACKWARD_HINT = "the model or the loss computes something its framework cannot differentiate on this batch"


def spec_errors(tspec, what: str, k: int = 0, hint: str | None = None):
    """What the spec's models (and losses, in their backward) raise on step k's batch is bad input:
    one line saying what failed, on which batch, and at which line of the spec. An error raised in
    this package's own code (a hook) stays an internal error, as in the forward check."""
    from ..spec import failure, spec_line

    def said(exc: BaseException) -> str:
        if isinstance(exc, SystemExit):
            return (f"spec '{tspec.path}': {what} called sys.exit({exc.code!r}) on {tspec.batch_name(k)}"
                    f"{spec_line(exc, tspec.path)}; a model must return its outputs")
        why = hint or ("the batches must fit the models as inputs() does" if tspec.has["batches"]
                       else "fix the model or inputs()")
        return f"spec '{tspec.path}': {what} fails on {tspec.batch_name(k)}: {failure(exc, tspec.path)}; {why}"
    return model_errors(said)


def float_outputs(out) -> list:
    """A model's floating outputs (of any width), in tree.flatten's order: the leaves the losses,
    the default projection and the checks take, alike on both sides."""
    return flatten(out, is_float_tensor)


def loss_value(loss) -> float:
    """A scalar loss of either framework as a Python float (paddle's bfloat16 widened first)."""
    if is_paddle_tensor(loss):
        return float(paddle_side.to_numpy(loss))
    return float(loss.detach())


def torch_loss(tspec, out, target):
    """The spec's torch loss, or the fixed projection of the outputs."""
    import torch
    if tspec.has["torch_loss"]:
        loss = tspec.loss("torch_loss", out, target)
    else:
        wide = lambda o: o if o.dtype in (torch.float32, torch.float64) else o.float()
        loss = _projected(tspec, out, "torch_model()", wide, lambda o, w: o * torch.from_numpy(w).to(o.dtype).to(o.device))
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UserError(f"spec '{tspec.path}': torch_loss(output, target) must return a scalar tensor; got "
                        f"{_what(loss, torch.Tensor)}")
    return loss.reshape(())


def paddle_loss(tspec, out, target):
    import paddle
    if tspec.has["paddle_loss"]:
        loss = tspec.loss("paddle_loss", out, target)
    else:
        wide = lambda o: o if o.dtype in (paddle.float32, paddle.float64) else o.astype("float32")
        loss = _projected(tspec, out, "paddle_model()", wide,
                          lambda o, w: o * paddle.to_tensor(w.astype(str(o.dtype).replace("paddle.", ""))))
    if not isinstance(loss, paddle.Tensor) or int(np.prod(loss.shape)) != 1:
        raise UserError(f"spec '{tspec.path}': paddle_loss(output, target) must return a scalar tensor; got "
                        f"{_what(loss, paddle.Tensor)}")
    return loss.reshape([])


def _projected(tspec, out, which: str, widened, weighted):
    """The default loss: the floating outputs of `which` (there must be one) projected on fixed random
    weights, summed in float32 at least on both sides (paddle adds no bfloat16 on CPU)."""
    outs = float_outputs(out)
    if not outs:
        raise UserError(f"{which} from '{tspec.path}' returns no floating-point tensor, and the default loss is a "
                        "projection of the floating outputs; define torch_loss(output, target) and "
                        "paddle_loss(output, target) in the spec")
    outs = [widened(o) for o in outs]
    return sum(weighted(o, w).sum() for o, w in zip(outs, tspec.projection(tuple(tuple(o.shape) for o in outs))))


def _what(value, tensor_type) -> str:
    """A loss that is not a scalar tensor, in a few words."""
    if isinstance(value, tensor_type):
        return f"a tensor of shape {list(value.shape)} (reduce it, e.g. with .mean())"
    return f"{type(value).__name__} (return a tensor of the loss's framework)"


def _bn_recorder(model, bn_stats: dict) -> list:
    """Hooks recording each BatchNorm's batch statistics in training into `bn_stats` (path -> list)."""
    import torch
    handles = []
    for path, module in model.named_modules():
        if type(module).__name__ not in TORCH_BATCHNORM or not module.track_running_stats:
            continue
        bn_stats[path] = []

        def pre(mod, args, _path=path):
            if mod.training:
                x = args[0].detach()
                dims = [d for d in range(x.dim()) if d != 1]
                with torch.no_grad():
                    stats = (x.double().mean(dims).cpu().numpy(), x.double().var(dims, unbiased=False).cpu().numpy())
                bn_stats[_path].append(stats)
        handles.append(module.register_forward_pre_hook(pre))
    return handles


def torch_run(session: TrainSession, tspec, batches, dtype, fmt=None, on_step=None) -> RunRecord:
    """Train a fresh copy of the torch model on `batches`; `on_step(k, optimizer, model, before)` (an
    OptimizerCheck) is called after each step with what the step started from (parameters, gradients,
    and the state where `on_step.checks(k)`)."""
    import torch
    model = session.torch_copy(dtype)
    device = "cpu" if dtype == torch.float64 else session.device
    opt, sched = tspec.torch_optimizer(model)
    losses, lrs, grads0, bn_stats = [], [], {}, {}
    handles = emulate_torch_training(model, fmt) + _bn_recorder(model, bn_stats)
    names = {id(p): n for n, p in model.named_parameters()}
    forward, hint = "torch_model() in training mode", None
    if dtype == torch.float64:
        forward, hint = "torch_model() in float64", ("--train calibrates its budgets against a float64 torch run: "
                                                     "make the forward work in float64 (no float32 constants forced)")
    run = f"torch {'float64' if dtype == torch.float64 else fmt or 'fp32'}"
    try:
        for k, (inputs, target) in enumerate(batches):
            progress.training_step(run, k, len(batches))
            lrs.append(float(opt.param_groups[0]["lr"]))
            opt.zero_grad(set_to_none=True)
            with spec_errors(tspec, forward, k, hint):
                out = call_model(model, to_torch(inputs, dtype or torch.float32, device))
            loss = torch_loss(tspec, out, to_torch(target, dtype or torch.float32, device))
            with spec_errors(tspec, "torch's backward (torch_model() and torch_loss)", k, BACKWARD_HINT):
                loss.backward()
            losses.append(loss_value(loss))
            grads, before = {}, None
            with one_thread():
                if k == 0 or on_step is not None:  # the gradients before clipping and the step change them
                    grads = {names[id(p)]: p.grad.detach().clone() for p in model.parameters() if p.grad is not None}
                if k == 0:
                    grads0 = {n: g.cpu().numpy() for n, g in grads.items()}
                if on_step is not None:
                    before = {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads": grads,
                              "state": _state_copy(opt) if on_step.checks(k) else None}
            if tspec.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tspec.clip_grad_norm)
            opt.step()
            if sched is not None:
                sched.step()
            if on_step is not None:
                on_step(k, opt, model, before)
    finally:
        remove(handles)
    with one_thread():
        final = {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}
    return RunRecord(losses, lrs, grads0, final, bn_stats)


def _state_copy(opt) -> dict:
    """The optimizer's state dict with every tensor of its state copied (its step changes them in place):
    cloned, not deep-copied one Python object at a time; its other values deep-copied."""
    import torch
    copied = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return {key: {index: {k: copied(v) for k, v in s.items()} for index, s in value.items()} if key == "state"
            else copy.deepcopy(value) for key, value in opt.state_dict().items()}


def paddle_optimizer(session: TrainSession, tspec, model):
    """The paddle side's (optimizer, scheduler): the spec's own, else torch's translated."""
    return tspec.paddle_optimizer(model) or session.translation.build(model)


def paddle_run(session: TrainSession, tspec, batches, fmt=None) -> RunRecord:
    model = session.paddle_copy()
    opt, sched = paddle_optimizer(session, tspec, model)
    losses, lrs, grads0 = [], [], {}
    handles = emulate_paddle_training(fmt)
    try:
        for k, (inputs, target) in enumerate(batches):
            progress.training_step(f"paddle {fmt or 'fp32'}", k, len(batches))
            lrs.append(float(opt.get_lr()))
            with spec_errors(tspec, "paddle_model() in training mode", k):
                out = call_model(model, to_paddle(inputs))
            loss = paddle_loss(tspec, out, to_paddle(target))
            with spec_errors(tspec, "paddle's backward (paddle_model() and paddle_loss)", k, BACKWARD_HINT):
                loss.backward()
            losses.append(loss_value(loss))
            if k == 0:  # a trainable parameter the backward did not reach has a zero gradient
                grads0 = {n: np.array(p.grad.numpy()) if p.grad is not None else np.zeros(p.shape, np.float32)
                          for n, p in model.named_parameters() if p.grad is not None or not p.stop_gradient}
            opt.step()
            opt.clear_grad()
            if sched is not None:
                sched.step()
    finally:
        remove(handles)
    return RunRecord(losses, lrs, grads0, {n: np.array(t.numpy()) for n, t in model.state_dict().items()}, {})
