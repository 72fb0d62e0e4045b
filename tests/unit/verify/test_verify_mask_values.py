"""Masked positions as outputs: torch fills them with finfo(dtype).min, which is float32's lowest in
its fp32 run and float64's in the float64 reference. Their difference is no drift, and must not make
the budget infinite: a port that forgets the mask is named, under both strategies."""

import numpy as np
import paddle
import pytest
import torch

from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

T, D = 8, 16


class TorchScores(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.query = torch.nn.Linear(D, D)

    def forward(self, x):
        q = self.query(x)
        scores = q @ x.transpose(-1, -2)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        return scores.masked_fill(causal, torch.finfo(scores.dtype).min)


class PaddleScores(paddle.nn.Layer):
    def __init__(self, masked=True):
        super().__init__()
        self.query = paddle.nn.Linear(D, D)
        self.masked = masked

    def forward(self, x):
        scores = self.query(x) @ x.transpose([0, 2, 1])
        if not self.masked:
            return scores
        causal = paddle.triu(paddle.ones([T, T]), 1).astype("bool")
        return paddle.where(causal, paddle.full_like(scores, float(np.finfo(np.float32).min)), scores)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scores = TorchScores()

    def forward(self, x):
        return self.scores(x)


class PaddleNet(paddle.nn.Layer):
    def __init__(self, masked=True):
        super().__init__()
        self.scores = PaddleScores(masked)

    def forward(self, x):
        return self.scores(x)


def torch_model():
    torch.manual_seed(0)
    return TorchNet().eval()


def inputs():
    return (np.random.default_rng(0).standard_normal((2, T, D)).astype("float32"),)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_forgotten_mask_is_named_and_the_masked_port_passes(strategy):
    forgot = verify(spec_from_functions(torch_model, lambda: PaddleNet(masked=False), inputs, label="no mask"),
                    Options(device="cpu", strategy=strategy), bisect=True)
    assert forgot.verdict == "fail" and forgot.first_bad.torch == "scores", forgot.to_json()["first_bad_layer"]
    clean = verify(spec_from_functions(torch_model, PaddleNet, inputs, label="masked"),
                   Options(device="cpu", strategy=strategy), bisect=True)
    assert clean.verdict == "pass", clean.to_json()["first_bad_layer"]
