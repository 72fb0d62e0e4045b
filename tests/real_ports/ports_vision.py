"""torchvision models against paddle.vision's ports of the same family, as port specs.

Both sides are built with random weights (torchvision `weights=None`, seeded); verify-port gives
the paddle model torch's weights through rules inferred from the two models (mapping None).
BatchNorm statistics are those of the model's own activations and its affine parameters are drawn
away from 1 and 0, so that a normalisation that differs shows. Inputs are small (one image, 64x64 where the model allows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from converter import PortSpec


def calibrate_batchnorms(model, shape: tuple, seed: int = 0) -> None:
    """Give every BatchNorm statistics of its own activations (one forward in training mode on
    another seeded image, averaged over it) and affine parameters away from 1 and 0: a normalisation
    that differs then shows, and activations stay of order 1 however deep the model is."""
    import torch
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: the statistics of this one forward
    x = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((8, *shape[1:])).astype("float32"))
    model.train()
    with torch.no_grad():
        model(x)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum  # the model's own again
            if m.affine:
                m.weight.copy_(1 + torch.randn(m.num_features, generator=g) * 0.1)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def torchvision_model(name: str, size: int, **kwargs):
    import torch
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kwargs)
    calibrate_batchnorms(model, (1, 3, size, size))
    return model.eval()


def paddle_vision_model(name: str, fix: Callable | None = None, **kwargs):
    import paddle
    import paddle.vision.models
    paddle.seed(0)
    model = getattr(paddle.vision.models, name)(**kwargs)
    if fix is not None:
        fix(model)
    return model.eval()


def image(size: int, batch: int = 1) -> tuple:
    return (np.random.default_rng(0).standard_normal((batch, 3, size, size)).astype("float32"),)


def dropout_as_torch(model) -> None:
    """paddle.vision's own `Dropout(mode="downscale_in_infer")` scales by 1 - p in eval, where
    torch's dropout is the identity: set torch's convention (`upscale_in_train`)."""
    import paddle
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.Dropout):
            layer.mode = "upscale_in_train"


@dataclass(frozen=True)
class VisionPair:
    name: str
    torch_name: str
    paddle_name: str
    size: int
    torch_kwargs: dict = field(default_factory=dict)
    paddle_kwargs: dict = field(default_factory=dict)
    fix: Callable | None = None  # applied to the paddle model after it is built
    batch: int = 1

    def spec(self) -> PortSpec:
        return PortSpec(torch_model=lambda: torchvision_model(self.torch_name, self.size, **self.torch_kwargs),
                        paddle_model=lambda: paddle_vision_model(self.paddle_name, self.fix, **self.paddle_kwargs),
                        inputs=lambda: image(self.size, self.batch), mapping=None, label=f"<{self.name}>")


def batchnorm_epsilon(epsilon: float):
    """paddle.vision's Inception-v3 normalises with BatchNorm2D's default epsilon 1e-5, where
    torchvision's BasicConv2d uses 1e-3: set torch's on every paddle BatchNorm2D."""
    def fix(model):
        import paddle
        for layer in model.sublayers():
            if isinstance(layer, paddle.nn.BatchNorm2D):
                layer._epsilon = epsilon  # read by BatchNorm2D.forward
    return fix


def ceil_mode_pool(path: str):
    """A planted bug: the paddle MaxPool2D at `path` rounds its output size up (ceil_mode)."""
    def fix(model):
        model.get_sublayer(path).ceil_mode = True  # read by MaxPool2D.forward
    return fix


def first_activation_relu(cls_name: str):
    """A planted bug: the first paddle activation of class `cls_name` replaced by a ReLU."""
    def fix(model):
        import paddle
        for name, layer in model.named_sublayers():
            if type(layer).__name__ == cls_name:
                parent, _, child = name.rpartition(".")
                setattr(model.get_sublayer(parent) if parent else model, child, paddle.nn.ReLU())
                return
        raise AssertionError(f"no {cls_name} in the paddle model")
    return fix


def avg_pool_exclusive(path: str):
    """A planted bug: the paddle AvgPool2D at `path` leaves the zero padding out of its average
    (exclusive=True), where torch's counts it (count_include_pad=True)."""
    def fix(model):
        model.get_sublayer(path).exclusive = True  # read by AvgPool2D.forward
    return fix


def both(*fixes):
    def fix(model):
        for f in fixes:
            f(model)
    return fix
