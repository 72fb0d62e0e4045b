"""Code between two search units (a model's own forward scaling what one block hands the next) is
named where full capture names it, the model's own forward, not at the next unit, which is within
its own budget."""

import numpy as np
import paddle
import pytest
import torch

from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

D, LAYERS = 32, 4


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh())
                                           for _ in range(LAYERS)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class PaddleNet(paddle.nn.Layer):
    def __init__(self, scale_after=None):
        super().__init__()
        self.blocks = paddle.nn.LayerList([paddle.nn.Sequential(paddle.nn.Linear(D, D), paddle.nn.Tanh())
                                           for _ in range(LAYERS)])
        self.scale_after = scale_after

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == self.scale_after:
                x = x * 1.5  # the port's own code between two blocks
        return x


def torch_model():
    torch.manual_seed(0)
    return TorchNet().eval()


def inputs():
    return (np.random.default_rng(0).standard_normal((4, D)).astype("float32"),)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_code_between_blocks_is_the_models_own(strategy):
    report = verify(spec_from_functions(torch_model, lambda: PaddleNet(scale_after=1), inputs, label="between"),
                    Options(device="cpu", strategy=strategy), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "", report.to_json()["first_bad_layer"]
    assert any("own forward" in d.cause for d in report.diagnosis), report.diagnosis


def test_the_clean_port_passes_under_binary():
    report = verify(spec_from_functions(torch_model, PaddleNet, inputs, label="clean"),
                    Options(device="cpu", strategy="binary"), bisect=True)
    assert report.verdict == "pass", report.to_json()["first_bad_layer"]


class TorchStaged(torch.nn.Module):
    """Blocks alternating with layers of a second list the forward indexes (ConvNeXt's
    downsample_layers[i] before stages[i]): the second list is never called itself."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.ModuleList([torch.nn.LayerNorm(D) for _ in range(LAYERS)])
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh(),
                                                               torch.nn.Linear(D, D)) for _ in range(LAYERS)])

    def forward(self, x):
        for i in range(LAYERS):
            x = self.blocks[i](self.down[i](x))
        return x


class PaddleStaged(paddle.nn.Layer):
    def __init__(self, epsilon_at=None):
        super().__init__()
        self.down = paddle.nn.LayerList([paddle.nn.LayerNorm(D, epsilon=1e-3 if i == epsilon_at else 1e-5)
                                         for i in range(LAYERS)])
        self.blocks = paddle.nn.LayerList([paddle.nn.Sequential(paddle.nn.Linear(D, D), paddle.nn.Tanh(),
                                                                paddle.nn.Linear(D, D)) for _ in range(LAYERS)])

    def forward(self, x):
        for i in range(LAYERS):
            x = self.blocks[i](self.down[i](x))
        return x


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_layer_of_a_list_never_called_itself_is_a_unit_and_named(strategy):
    def staged():
        torch.manual_seed(0)
        return TorchStaged().eval()
    report = verify(spec_from_functions(staged, lambda: PaddleStaged(epsilon_at=2), inputs, label="staged"),
                    Options(device="cpu", strategy=strategy), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "down.2", report.to_json()["first_bad_layer"]
