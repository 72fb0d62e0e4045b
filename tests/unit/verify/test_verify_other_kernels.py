"""A paddle side whose kernels sum in another order than torch's: budgets must hold for it.

The port below computes its Linear layers and its LayerNorm's statistics by sequential sums
(paddle.cumsum along the reduction, in float32: the worst common summation order), where
torch's kernels sum in blocks. Only torch's own fp32 error is observed, so the budget must
allow the other side any summation order. A clean pair passes; a real bug is still named."""

import pytest
import numpy as np
import paddle
import torch

from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

WIDTH, HIDDEN, ROWS = 384, 1536, 16


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


class SequentialLinear(paddle.nn.Linear):
    """x @ W + b with the products summed one after another along K."""

    def forward(self, x):
        products = x.unsqueeze(-1) * self.weight  # [..., K, N]
        return paddle.cumsum(products, axis=-2)[..., -1, :] + self.bias


def sequential_mean(x):
    return paddle.cumsum(x, axis=-1)[..., -1:] / x.shape[-1]


class SequentialLayerNorm(paddle.nn.LayerNorm):
    """LayerNorm whose mean and variance are sequential sums over the features."""

    def forward(self, x):
        centred = x - sequential_mean(x)
        variance = sequential_mean(centred * centred)
        return centred / paddle.sqrt(variance + self._epsilon) * self.weight + self.bias


class PaddleNet(paddle.nn.Layer):
    def __init__(self, epsilon=1e-5):
        super().__init__()
        self.up = SequentialLinear(WIDTH, HIDDEN)
        self.norm = SequentialLayerNorm(HIDDEN, epsilon=epsilon)
        self.down = SequentialLinear(HIDDEN, WIDTH)

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


def torch_model():
    torch.manual_seed(0)
    model = TorchNet()
    with torch.no_grad():  # activations of order one, as a trained model has
        for linear in (model.up, model.down):
            linear.weight.normal_(0, linear.in_features ** -0.5)
        model.norm.weight.normal_(1.0, 0.1)
    return model.eval()


def inputs():
    return (np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype("float32"),)


def _run(paddle_model):
    spec = spec_from_functions(torch_model, paddle_model, inputs, label="sequential sums")
    return verify(spec, Options(device="cpu", strategy="full"), bisect=True)


@pytest.mark.slow


def test_the_sequential_sums_are_further_from_float64_than_torchs_kernels():
    """The premise: on this machine the port's kernels really sum worse than torch's."""
    x = np.random.default_rng(1).standard_normal((ROWS, HIDDEN)).astype("float32")
    w = torch_model().down.weight.detach().numpy().T.copy()  # K = 1536: torch sums in blocks
    exact = x.astype(np.float64) @ w.astype(np.float64)
    t = (torch.from_numpy(x) @ torch.from_numpy(w)).numpy()
    layer = SequentialLinear(HIDDEN, WIDTH)
    layer.weight.set_value(w)
    layer.bias.set_value(np.zeros(WIDTH, "float32"))
    p = layer(paddle.to_tensor(x)).numpy()
    assert np.sqrt(np.mean((p - exact) ** 2)) > 1.5 * np.sqrt(np.mean((t - exact) ** 2))


@pytest.mark.slow


def test_a_clean_port_summing_sequentially_passes():
    report = _run(PaddleNet)
    worst = max(report.layers, key=lambda r: r.ratio or 0)
    assert report.verdict == "pass", report.to_json()["first_bad_layer"]
    assert worst.ratio < 0.6, (worst.torch, worst.ratio)


@pytest.mark.slow


def test_a_wrong_epsilon_is_still_named_there():
    report = _run(lambda: PaddleNet(epsilon=1e-3))
    assert report.verdict == "fail"
    assert report.first_bad.torch == "norm", report.to_json()["first_bad_layer"]
