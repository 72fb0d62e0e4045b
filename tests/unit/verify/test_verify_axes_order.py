"""Two ports that lay out the same values with their axes in another order: HF's Gemma 3 runs its
q/k norms on [batch, heads, tokens, dim], PaddleFormers' on [batch, tokens, heads, dim]. The layout
is never a difference: a clean pair passes with the norm judged within its budget, and a norm
with another epsilon is named at the norm."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

B, T, HEADS, D = 2, 6, 4, 8


class TorchRMSNorm(torch.nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.linspace(0.5, 1.5, D)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class PaddleRMSNorm(paddle.nn.Layer):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = self.create_parameter([D], default_initializer=paddle.nn.initializer.Constant(1.0))
        self.eps = eps

    def forward(self, x):
        return x * paddle.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TorchHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.norm, self.out = torch.nn.Linear(HEADS * D, HEADS * D), TorchRMSNorm(), torch.nn.Linear(HEADS * D, 3)

    def forward(self, x):
        h = self.norm(self.proj(x).view(B, T, HEADS, D).transpose(1, 2))  # heads before tokens
        return self.out(h.transpose(1, 2).reshape(B, T, HEADS * D))


class PaddleHeads(paddle.nn.Layer):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.proj, self.norm, self.out = paddle.nn.Linear(HEADS * D, HEADS * D), PaddleRMSNorm(eps), paddle.nn.Linear(HEADS * D, 3)

    def forward(self, x):
        h = self.norm(self.proj(x).reshape([B, T, HEADS, D]))  # tokens before heads
        return self.out(h.reshape([B, T, HEADS * D]))


def _torch():
    torch.manual_seed(0)
    return TorchHeads().eval()


def _verify(eps, strategy):
    spec = spec_from_functions(_torch, lambda: PaddleHeads(eps),
                               lambda: (np.random.default_rng(0).standard_normal((B, T, HEADS * D)).astype("float32"),))
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_norm_on_another_order_of_axes_passes(strategy):
    report = _verify(1e-6, strategy)
    assert report.verdict == "pass", report.first_bad
    norm = next(r for r in report.layers if r.torch == "norm")
    assert norm.ratio is not None and norm.ratio < 1 and "axes in the order [0, 2, 1, 3]" in norm.note, norm


def test_another_epsilon_on_another_order_of_axes_is_named_at_the_norm():
    report = _verify(1e-1, "full")
    assert report.verdict == "fail"
    assert report.first_bad.torch == "norm", report.first_bad
