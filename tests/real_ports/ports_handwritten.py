"""Public hand-written ports, as port specs: a PyTorch model file and its PaddlePaddle port written
by other people, both vendored under handwritten/ (each with a header naming its repository, path,
commit and licence, and a `HAND FIX:` comment at each line changed to make it import here).

* ConvNeXt: facebookresearch/ConvNeXt against PaddleClas' port (Linear and LayerNorm on channels
  last, its own channels-first LayerNorm, a layer-scale parameter `gamma`).
* RepVGG: DingXiaoH/RepVGG against PaddleClas' port (three-branch blocks: 3x3 conv + BN, 1x1 conv +
  BN and a BN identity, summed).
* U^2-Net (small, U2NETP): xuebinqin/U-2-Net against PaddleSeg's port (nested U-blocks, dilated
  convolutions, ceil-mode pools, bilinear upsampling to the skip's size; seven outputs).
* ViT: timm's VisionTransformer (the installed package) against PaddleClas' port of it (vendored).

Each side is built from its own file with random weights (seeded); verify-port gives the paddle
model torch's weights through rules inferred from the two models (mapping None). BatchNorms get
statistics of the model's own activations (ports_vision.calibrate_batchnorms); ConvNeXt's layer
scale starts at 1 (its constructor argument) rather than 1e-6, so that each block's branch counts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from converter import PortSpec

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "handwritten")


def vendored(name: str):
    """Import handwritten/<name>.py once, as module `handwritten_<name>`."""
    module_name = f"handwritten_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # timm's register_model looks its module up there
    with warnings.catch_warnings():
        # ConvNeXt's file registers convnext_tiny..xlarge in timm's registry, over timm's own entries
        warnings.filterwarnings("ignore", message="Overwriting convnext_", category=UserWarning)
        spec.loader.exec_module(module)
    return module


def image(size: int, batch: int = 1) -> tuple:
    return (np.random.default_rng(0).standard_normal((batch, 3, size, size)).astype("float32"),)


def _torch_model(build: Callable, size: int):
    import torch

    from ports_vision import calibrate_batchnorms
    torch.manual_seed(0)
    model = build()
    calibrate_batchnorms(model, (1, 3, size, size))
    return model.eval()


def _paddle_model(build: Callable, fix: Callable | None):
    import paddle
    paddle.seed(0)
    model = build()
    if fix is not None:
        fix(model)
    return model.eval()


# The ports at tiny sizes: (torch builder, paddle builder), each from its own vendored file.
CONVNEXT = dict(depths=[1, 1, 2, 1], dims=[8, 16, 32, 64], layer_scale_init_value=1.0)
REPVGG = dict(num_blocks=[1, 2, 2, 1], width_multiplier=[0.25, 0.25, 0.25, 0.25])


def convnext_torch():
    return vendored("convnext_torch").ConvNeXt(num_classes=10, **CONVNEXT)


def convnext_paddle():
    return vendored("convnext_paddle").ConvNeXt(class_num=10, **CONVNEXT)


def repvgg_torch():
    return vendored("repvgg_torch").RepVGG(num_classes=10, **REPVGG)


def repvgg_paddle():
    return vendored("repvgg_paddle").RepVGG(class_num=10, **REPVGG)


def u2netp_torch():
    return vendored("u2net_torch").U2NETP(3, 1)


def u2netp_paddle():
    return vendored("u2net_paddle").U2Netp(1)


PORTS = {"convnext": (convnext_torch, convnext_paddle), "repvgg": (repvgg_torch, repvgg_paddle),
         "u2netp": (u2netp_torch, u2netp_paddle)}


@dataclass(frozen=True)
class HandwrittenPair:
    name: str
    port: str  # a key of PORTS
    size: int
    fix: Callable | None = None  # applied to the paddle model after it is built

    def spec(self) -> PortSpec:
        build_torch, build_paddle = PORTS[self.port]
        return PortSpec(torch_model=lambda: _torch_model(build_torch, self.size),
                        paddle_model=lambda: _paddle_model(build_paddle, self.fix),
                        inputs=lambda: image(self.size), mapping=None, label=f"<{self.name}>")


# Fixes of the paddle model: what a port's user sets after building it, and planted bugs.

def sigmoid_outputs(model) -> None:
    """PaddleSeg's U2Netp returns the seven side outputs as logits (its loss and predictor apply the
    sigmoid), where the original returns them through F.sigmoid: its class extended to return the same."""
    import paddle.nn.functional as F
    base = type(model)

    class WithSigmoids(base):  # a class, not a forward set on the instance: a copy of the model is its own
        def forward(self, x):
            return tuple(F.sigmoid(d) for d in base.forward(self, x))
    model.__class__ = WithSigmoids


def set_attr(path: str, attr: str, value):
    """A planted bug: `attr` of the paddle layer at `path` set to `value` (an attribute its forward reads)."""
    def fix(model):
        layer = model.get_sublayer(path)
        assert hasattr(layer, attr), f"{path} has no {attr}"
        setattr(layer, attr, value)
    return fix


def replace_layer(path: str, make: Callable):
    """A planted bug: the paddle layer at `path` replaced by `make()`."""
    def fix(model):
        parent, _, child = path.rpartition(".")
        setattr(model.get_sublayer(parent) if parent else model, child, make())
    return fix



# timm's VisionTransformer (installed) against PaddleClas' port of it (vendored), at a tiny size with the
# settings of timm's defaults: qkv bias, LayerNorm eps 1e-6 (PaddleClas' own default epsilon is 1e-5).
VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, qkv_bias=True)


def vit_timm():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(num_classes=10, **VIT)


def vit_paddle():
    return vendored("vit_paddle").VisionTransformer(class_num=10, epsilon=1e-6, **VIT)


PORTS["vit-timm"] = (vit_timm, vit_paddle)
