"""The loss, teacher-forced: paddle's loss on torch's outputs and targets against torch's loss,
and the gradient of each with respect to the outputs, against budgets from torch's loss in
float64 on the same values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from ..compare.precision import U32
from ..frameworks import torch_side
from ..tree import is_torch_tensor, map_leaves, replace
from .judge import judge
from .loop import (BACKWARD_HINT, call_model, float_outputs, loss_value, paddle_loss, spec_errors, to_paddle, to_torch,
                   torch_loss)
from .session import TrainSession


@dataclass(frozen=True)
class LossProbe:
    """Both losses on torch's outputs of the first batch, with what the what-ifs need."""

    outputs: list  # torch's fp32 outputs, numpy
    target: object  # the batch's target, numpy
    loss_torch: float
    loss_torch64: float
    loss_paddle: float
    grads_torch: list
    grads_torch64: list
    grads_paddle: list


_NOT_DIFFERENTIABLE = ("spec '{path}': {name}(output, target) returns a loss that does not depend on the output "
                       "(it {how}: a constant, a detached value or a count such as an accuracy); return a "
                       "differentiable loss of the output")


def _torch_side(tspec, structure, outputs, target, dtype):
    import torch
    leaves = [torch.from_numpy(o).to(dtype).requires_grad_(True) for o in outputs]
    out = replace(structure, leaves)
    loss = torch_loss(tspec, out, to_torch(target, dtype, "cpu"))
    if not loss.requires_grad:
        raise UserError(_NOT_DIFFERENTIABLE.format(path=tspec.path, name="torch_loss", how="has no grad_fn"))
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return loss_value(loss), [np.zeros_like(o) if g is None else g.numpy() for g, o in zip(grads, outputs)]


def _paddle_side(tspec, structure, outputs, target):
    """Paddle's loss on torch's outputs: each floating output of paddle's (any width) replaced, in
    tree.flatten's order, by torch's in float32, as _torch_side takes them."""
    import paddle
    own = len(float_outputs(structure))
    if own > len(outputs):
        raise UserError(f"paddle_model() from '{tspec.path}' returns {own} floating-point tensors and torch_model() "
                        f"{len(outputs)}: the loss is checked on torch's outputs in place of paddle's, so each of "
                        "paddle's needs one of torch's; return the same outputs from both models")
    leaves = [paddle.to_tensor(o, stop_gradient=False) for o in outputs]
    out = replace(structure, dict(enumerate(leaves)))  # torch's outputs beyond paddle's are left unused
    loss = paddle_loss(tspec, out, to_paddle(target))
    if loss.stop_gradient:
        raise UserError(_NOT_DIFFERENTIABLE.format(path=tspec.path, name="paddle_loss", how="has stop_gradient=True"))
    grads = paddle.grad([loss], leaves, allow_unused=True)
    return loss_value(loss), [np.zeros_like(o) if g is None else np.array(g.numpy()) for g, o in zip(grads, outputs)]


def probe(session: TrainSession, tspec, batch) -> LossProbe:
    """Both losses (and their gradients) on torch's outputs of `batch`: paddle's loss teacher-forced."""
    import paddle
    import torch
    inputs, target = batch
    model = session.run_only_copy("torch")
    with spec_errors(tspec, "torch_model() in training mode"):
        structure = call_model(model, to_torch(inputs, torch.float32, session.device))
    outputs = [torch_side.to_numpy(o) for o in float_outputs(structure)]  # float16 and bfloat16 widened
    structure = map_leaves(structure, lambda t: t.detach().cpu(), is_torch_tensor)
    with spec_errors(tspec, "torch_loss's backward", hint=BACKWARD_HINT):
        lt, gt = _torch_side(tspec, structure, outputs, target, torch.float32)
    with spec_errors(tspec, "torch_loss in float64", hint="--train calibrates the loss's budget against torch_loss "
                     "in float64: make it work in float64 (no float32 constants forced)"):
        l64, g64 = _torch_side(tspec, structure, [o.astype(np.float64) for o in outputs], target, torch.float64)
    pmodel = session.run_only_copy("paddle")
    with paddle.no_grad(), spec_errors(tspec, "paddle_model() in training mode"):
        pstructure = call_model(pmodel, to_paddle(inputs))
    with spec_errors(tspec, "paddle_loss's backward", hint=BACKWARD_HINT):
        lp, gp = _paddle_side(tspec, pstructure, outputs, target)
    return LossProbe(outputs, target, lt, l64, lp, gt, g64, gp)


def loss_rows(p: LossProbe) -> list:
    n = sum(o.size for o in p.outputs)
    floor = U32 * abs(p.loss_torch) * math.sqrt(max(n, 1))  # a reduction summed in another order
    rows = [judge("loss", 0, "loss", "loss", np.array([p.loss_torch]), np.array([p.loss_paddle]),
                  np.array([p.loss_torch - p.loss_torch64]), floor)]
    for i, (gt, g64, gp) in enumerate(zip(p.grads_torch, p.grads_torch64, p.grads_paddle)):
        name = "d loss / d output" + (f"[{i}]" if len(p.outputs) > 1 else "")
        rows.append(judge("loss", 0, name, name, gt, gp, gt - g64.astype(np.float32)))
    return rows
