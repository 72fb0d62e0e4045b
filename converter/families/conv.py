"""Convolutions keep their layout: [out, in/g, k...] and, transposed, [in, out/g, k...] on both
sides. Paddle calls its padding mode `_padding_mode`."""

import math

from ..diagnosis import Diagnosis
from . import Family, register, same_weight_and_bias


def _conv_products(module, args, weight2, square):
    kernel = math.prod(module.kernel_size)
    return module._conv_forward(square(args[0]), weight2, None), module.in_channels / module.groups * kernel


def _conv_transpose_products(module, args, weight2, square):
    import torch.nn.functional as F
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(module.kernel_size)]
    s2 = fn(square(args[0]), weight2, None, module.stride, module.padding, module.output_padding, module.groups,
            module.dilation)
    k = module.in_channels / module.groups * math.prod(module.kernel_size) / math.prod(module.stride)
    return s2, max(k, 1.0)


def padding_mode(ctx, where, torch_module, paddle_layer) -> list:
    t_mode, p_mode = getattr(torch_module, "padding_mode", None), getattr(paddle_layer, "_padding_mode", None)
    if not t_mode or not p_mode or t_mode == p_mode:
        return []
    return [Diagnosis(where, f"padding mode differs: torch '{t_mode}', paddle '{p_mode}'",
                      f"construct the paddle layer with padding_mode='{t_mode}'", kind="padding mode")]


register(Family("conv", ("Conv1d", "Conv2d", "Conv3d"), ("Conv1D", "Conv2D", "Conv3D"), same_weight_and_bias, _conv_products,
                what_ifs=(padding_mode,)))
register(Family("conv-transpose", ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"),
                ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"), same_weight_and_bias,
                _conv_transpose_products))
