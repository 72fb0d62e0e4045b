"""Matmul formats emulated in training: the inputs and weights of every Linear/Conv layer are
rounded to the format for its forward (the stored weights stay as they are, as on a GPU in TF32),
and gradients flow through the rounding unchanged (straight through)."""

from __future__ import annotations

from ._verify import round_array, round_torch

TORCH_MATMULS = ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
PADDLE_MATMULS = ("Linear", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose")


def _is(obj, names) -> bool:
    return any(c.__name__ in names for c in type(obj).__mro__)


class Emulation:
    """The formats each side computes its matmuls in; applies them to models in training."""

    def __init__(self, formats: dict):
        self.formats = dict(formats)

    def apply_torch(self, model, fmt: str | None) -> list:
        """Hooks rounding `model`'s matmul inputs and weights to fmt (none for fp32 or None)."""
        if fmt in (None, "fp32"):
            return []
        import torch
        handles = []
        for module in model.modules():
            if _is(module, TORCH_MATMULS) and isinstance(getattr(module, "weight", None), torch.Tensor):
                handles += _torch_hooks(module, fmt)
        return handles

    def apply_paddle(self, model, fmt: str | None) -> list:
        if fmt in (None, "fp32"):
            return []
        handles = []
        for _, layer in model.named_sublayers(include_self=True):
            if _is(layer, PADDLE_MATMULS) and getattr(layer, "weight", None) is not None:
                handles += _paddle_hooks(layer, fmt)
        return handles


def _torch_hooks(module, fmt: str) -> list:
    import torch

    def straight(a):
        if not isinstance(a, torch.Tensor) or not a.is_floating_point():
            return a
        return a + (round_torch(a.detach(), fmt) - a.detach())

    def pre(mod, args):
        # the forward (and its backward) sees the rounded weight; the gradient reaches the parameter
        weight = mod._parameters.pop("weight")
        object.__setattr__(mod, "_port_weight", weight)
        object.__setattr__(mod, "weight", straight(weight))
        return tuple(straight(a) for a in args)

    def post(mod, args, out):
        object.__delattr__(mod, "weight")
        mod._parameters["weight"] = mod.__dict__.pop("_port_weight")

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def _paddle_hooks(layer, fmt: str) -> list:
    import paddle

    def straight(a):
        if not isinstance(a, paddle.Tensor) or a.dtype not in (paddle.float32, paddle.float64):
            return a
        return a + (paddle.to_tensor(round_array(a.numpy(), fmt)) - a).detach()

    def pre(lay, args):
        weight = lay._parameters.pop("weight")
        object.__setattr__(lay, "_port_weight", weight)
        object.__setattr__(lay, "weight", straight(weight))
        return tuple(straight(a) for a in args)

    def post(lay, args, out):
        object.__delattr__(lay, "weight")
        lay._parameters["weight"] = lay.__dict__.pop("_port_weight")

    return [layer.register_forward_pre_hook(pre), layer.register_forward_post_hook(post)]


def remove(handles: list) -> None:
    for h in handles:
        h.remove()
