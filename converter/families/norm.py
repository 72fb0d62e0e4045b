"""Normalisation layers: BatchNorm's running stats are `_mean`/`_variance` in paddle, and
InstanceNorm's weight is `scale`. Counters and statistics paddle does not keep are dropped.
Epsilon is `eps` in torch and `_epsilon` in paddle; paddle's BatchNorm momentum weights the
old statistics (torch's the new batch). paddle's legacy `nn.BatchNorm(act=...)` runs its activation
inside the layer: compared after it (FusedActivation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..diagnosis import Diagnosis
from . import Family, PortedLayer, OutputReading, register, same_weight_and_bias

EPSILON = ("eps", "_epsilon", "epsilon")


def _batch_norm(pair: PortedLayer) -> None:
    same_weight_and_bias(pair)
    pair.rename("running_mean", "_mean")
    pair.rename("running_var", "_variance")
    pair.drop("num_batches_tracked")


def _instance_norm(pair: PortedLayer) -> None:
    pair.rename("weight", "scale")
    pair.rename("bias")
    # paddle's InstanceNorm always normalises with the instance's own statistics
    pair.drop("running_mean")
    pair.drop("running_var")
    pair.drop("num_batches_tracked")


def momentum_convention(ctx, where, torch_module, paddle_layer) -> list:
    t, p = getattr(torch_module, "momentum", None), getattr(paddle_layer, "_momentum", None)
    if t is None or p is None or np.isclose(p, 1.0 - t):
        return []
    return [Diagnosis(where, f"BatchNorm momentum convention: torch momentum={t:g} weights the new batch, paddle "
                      f"momentum={p:g} weights the old statistics", f"use momentum={1.0 - t:g} in paddle (1 - torch's)", kind="momentum")]


def batch_statistics(ctx, where, torch_module, paddle_layer) -> list:
    """What-if: does paddle's output match normalising with the batch's own statistics?"""
    import torch.nn.functional as F

    ev, call = ctx.evidence, ctx.t_call
    if where != ctx.name or ev is None or ev.y_local is None or call is None:
        return []
    m = torch_module
    x = call.args[0].detach().cpu().double()
    w = None if m.weight is None else m.weight.detach().cpu().double()
    b = None if m.bias is None else m.bias.detach().cpu().double()
    batch = F.batch_norm(x, None, None, w, b, True, 0.0, m.eps).numpy()
    scale = float(np.abs(batch).max()) + 1e-30
    if batch.size != ev.y_local.size or float(np.abs(batch.ravel() - ev.y_local.ravel()).max()) >= 1e-4 * scale:
        return []
    return [Diagnosis(where, "the paddle BatchNorm normalises with the batch's own statistics (training mode), torch "
                      "with its running statistics",
                      "call model.eval(), and do not pass training=True / use_global_stats=False to batch_norm", kind="batch statistics")]


def torch_batch_statistics(ctx, where, torch_module, paddle_layer) -> list:
    """What-if: torch's BatchNorm keeps no running statistics (track_running_stats=False) and
    normalises with the batch's own in eval too; does paddle's layer, run the same way on the
    recorded input, give torch's output?"""
    import paddle
    import paddle.nn.functional as F

    ev, call = ctx.evidence, ctx.t_call
    if where != ctx.name or ev is None or ev.y_torch is None or call is None or \
            getattr(torch_module, "running_mean", "absent") is not None:
        return []
    x = paddle.to_tensor(call.args[0].detach().cpu().double().numpy())
    weight, bias = (None if getattr(paddle_layer, n, None) is None else getattr(paddle_layer, n).astype("float64")
                    for n in ("weight", "bias"))
    c = x.shape[1]
    zeros, ones = paddle.zeros([c], "float64"), paddle.ones([c], "float64")
    batch = F.batch_norm(x, zeros, ones, weight, bias, training=True, epsilon=float(paddle_layer._epsilon)).numpy()
    y = np.asarray(ev.y_torch, dtype=np.float64)
    if batch.size != y.size or float(np.abs(batch.ravel() - y.ravel()).max()) >= 1e-4 * (float(np.abs(y).max()) + 1e-30):
        return []
    return [Diagnosis(where, "torch's BatchNorm keeps no running statistics (track_running_stats=False): it normalises "
                      "every batch with the batch's own statistics, in eval too; paddle's normalises with running "
                      "statistics that no torch tensor fills (confirmed by re-running paddle's layer with the batch's "
                      "statistics: it gives torch's output)",
                      f"construct paddle's {type(paddle_layer).__name__} with use_global_stats=False",
                      kind="batch statistics")]


@dataclass(frozen=True)
class FusedActivation(OutputReading):
    """paddle's legacy `nn.BatchNorm(act=...)` applies its activation inside the layer, where torch
    runs it as a module of its own after the norm: the two are compared after the activation,
    torch's output put through it (`of_torch`), paddle's as it is."""

    act: str
    reads_torch = True

    @classmethod
    def of_module(cls, torch_module, paddle_layer=None) -> FusedActivation | None:
        act = getattr(paddle_layer, "_act", None)
        return cls(act) if isinstance(act, str) and act in _ACTIVATIONS else None

    def of_torch(self, outputs: list) -> list:
        """torch's outputs (tensors or numpy arrays, each given back as it came) put through the activation."""
        out = []
        for o in outputs:
            if isinstance(o, np.ndarray):
                out.append(_ACTIVATIONS[self.act](o) if np.issubdtype(o.dtype, np.floating) else o)
            elif o.is_floating_point():
                import torch
                out.append(torch.from_numpy(_ACTIVATIONS[self.act](o.detach().cpu().numpy())))
            else:
                out.append(o)
        return out

    @property
    def note(self) -> str:
        return (f"compared after the activation: paddle's BatchNorm applies act='{self.act}' inside it, torch's output "
                f"put through {self.act}")


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function in x's own precision (an overflow to inf gives 0, as it should)."""
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(x.dtype)


# paddle's act names
_ACTIVATIONS = {"relu": lambda x: np.maximum(x, x.dtype.type(0)), "sigmoid": sigmoid, "tanh": np.tanh}

register(Family("batch-norm", ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"),
                ("BatchNorm1D", "BatchNorm2D", "BatchNorm3D", "BatchNorm", "SyncBatchNorm"), _batch_norm,
                epsilon=EPSILON, what_ifs=(momentum_convention, batch_statistics, torch_batch_statistics),
                reads=FusedActivation.of_module))
register(Family("layer-norm", ("LayerNorm",), ("LayerNorm",), same_weight_and_bias, epsilon=EPSILON))
register(Family("group-norm", ("GroupNorm",), ("GroupNorm",), same_weight_and_bias, epsilon=EPSILON))
register(Family("instance-norm", ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"),
                ("InstanceNorm1D", "InstanceNorm2D", "InstanceNorm3D"), _instance_norm, epsilon=EPSILON))
