"""The loss, teacher-forced: paddle's loss on torch's outputs and targets against torch's loss,
and the gradient of each with respect to the outputs, against budgets from torch's loss in
float64 on the same values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from ..compare.precision import U32
from .judge import judge
from .loop import BACKWARD_HINT, call_model, float_outputs, paddle_loss, spec_errors, to_paddle, to_torch, torch_loss


def replace_leaves(value, is_leaf, leaves: list):
    """`value` with its float tensors (in flatten order) replaced by `leaves`, consumed in order."""
    if is_leaf(value):
        return leaves.pop(0)
    if isinstance(value, dict):
        return type(value)((k, replace_leaves(v, is_leaf, leaves)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(replace_leaves(v, is_leaf, leaves) for v in value)
    return value


@dataclass
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
    is_leaf = lambda v: isinstance(v, torch.Tensor) and v.is_floating_point()
    out = replace_leaves(structure, is_leaf, list(leaves))
    loss = torch_loss(tspec, out, to_torch(target, dtype, "cpu"), dtype)
    if not loss.requires_grad:
        raise UserError(_NOT_DIFFERENTIABLE.format(path=tspec.path, name="torch_loss", how="has no grad_fn"))
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return float(loss.detach()), [np.zeros_like(o) if g is None else g.numpy() for g, o in zip(grads, outputs)]


def _paddle_side(tspec, structure, outputs, target):
    import paddle
    leaves = [paddle.to_tensor(o, stop_gradient=False) for o in outputs]
    is_leaf = lambda v: isinstance(v, paddle.Tensor) and v.dtype in (paddle.float32, paddle.float64)
    out = replace_leaves(structure, is_leaf, list(leaves))
    loss = paddle_loss(tspec, out, to_paddle(target))
    if loss.stop_gradient:
        raise UserError(_NOT_DIFFERENTIABLE.format(path=tspec.path, name="paddle_loss", how="has stop_gradient=True"))
    grads = paddle.grad([loss], leaves, allow_unused=True)
    return float(loss.numpy()), [np.zeros_like(o) if g is None else np.array(g.numpy()) for g, o in zip(grads, outputs)]


def probe(session, tspec, batch) -> LossProbe:
    import paddle
    import torch
    inputs, target = batch
    model = session.torch_copy()
    with spec_errors(tspec, "torch_model() in training mode"):
        structure = call_model(model, to_torch(inputs, torch.float32, session.device))
    outputs = [o.detach().cpu().numpy() for o in float_outputs(structure, "torch")]
    structure = _to_cpu(structure)
    with spec_errors(tspec, "torch_loss's backward", hint=BACKWARD_HINT):
        lt, gt = _torch_side(tspec, structure, outputs, target, torch.float32)
    with spec_errors(tspec, "torch_loss in float64", hint="--train calibrates the loss's budget against torch_loss "
                     "in float64: make it work in float64 (no float32 constants forced)"):
        l64, g64 = _torch_side(tspec, structure, [o.astype(np.float64) for o in outputs], target, torch.float64)
    pmodel = session.paddle_copy()
    with paddle.no_grad(), spec_errors(tspec, "paddle_model() in training mode"):
        pstructure = call_model(pmodel, to_paddle(inputs))
    with spec_errors(tspec, "paddle_loss's backward", hint=BACKWARD_HINT):
        lp, gp = _paddle_side(tspec, pstructure, outputs, target)
    return LossProbe(outputs, target, lt, l64, lp, gt, g64, gp)


def _to_cpu(value):
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _to_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_cpu(v) for v in value)
    return value


def loss_rows(p: LossProbe) -> list:
    n = sum(o.size for o in p.outputs)
    floor = U32 * abs(p.loss_torch) * math.sqrt(max(n, 1))  # a reduction summed in another order
    rows = [judge("loss", 0, "loss", "loss", np.array([p.loss_torch]), np.array([p.loss_paddle]),
                  np.array([p.loss_torch - p.loss_torch64]), floor)]
    for i, (gt, g64, gp) in enumerate(zip(p.grads_torch, p.grads_torch64, p.grads_paddle)):
        name = "d loss / d output" + (f"[{i}]" if len(p.outputs) > 1 else "")
        rows.append(judge("loss", 0, name, name, gt, gp, gt - g64.astype(np.float32)))
    return rows
