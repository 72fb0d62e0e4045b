"""Matmul formats emulated in training: the inputs and weights of every Linear/Conv layer are
rounded to the format for its forward (the stored weights stay as they are, as on a GPU in TF32),
and gradients flow through the rounding unchanged (straight through)."""

from __future__ import annotations

from ..families import paddle_rounds_inputs, rounds_inputs
from ..compare.precision import round_array, round_torch


class Emulation:
    """The formats each side computes its matmuls in; applies them to models in training."""

    def __init__(self, formats: dict):
        self.formats = dict(formats)

    def apply_torch(self, model, fmt: str | None) -> list:
        """Hooks rounding `model`'s matmul inputs and weights to fmt (none for fp32 or None)."""
        if fmt in (None, "fp32"):
            return []
        handles = []
        for module in model.modules():
            if rounds_inputs(module):  # the layer families say which layers a format rounds
                handles += _torch_hooks(module, fmt)
        return handles

    def apply_paddle(self, model, fmt: str | None) -> list:
        if fmt in (None, "fp32"):
            return []
        handles = []
        for _, layer in model.named_sublayers(include_self=True):
            if paddle_rounds_inputs(layer):
                handles += _paddle_hooks(layer, fmt)
        return handles


def _torch_hooks(module, fmt: str) -> list:
    import torch

    def straight(a):
        if not isinstance(a, torch.Tensor) or not a.is_floating_point():
            return a
        return a + (round_torch(a.detach(), fmt) - a.detach())
    return _rounded_weight_hooks(module, straight, "register_forward_hook")


def _paddle_hooks(layer, fmt: str) -> list:
    import paddle

    def straight(a):
        if not isinstance(a, paddle.Tensor) or a.dtype not in (paddle.float32, paddle.float64):
            return a
        return a + (paddle.to_tensor(round_array(a.numpy(), fmt)) - a).detach()
    return _rounded_weight_hooks(layer, straight, "register_forward_post_hook")


def _rounded_weight_hooks(layer, straight, post_method: str) -> list:
    """Hooks under which the forward (and its backward) sees `straight(weight)` and `straight` of
    its inputs, while the gradient reaches the parameter itself; the frameworks differ only in
    `straight` and the name of the method that adds a post-hook."""

    def pre(lay, args):
        weight = lay._parameters.pop("weight")
        object.__setattr__(lay, "_port_weight", weight)
        object.__setattr__(lay, "weight", straight(weight))
        return tuple(straight(a) for a in args)

    def post(lay, args, out):
        object.__delattr__(lay, "weight")
        lay._parameters["weight"] = lay.__dict__.pop("_port_weight")

    return [layer.register_forward_pre_hook(pre), getattr(layer, post_method)(post)]


def remove(handles: list) -> None:
    for h in handles:
        h.remove()
