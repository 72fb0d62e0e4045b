"""What real ports do that the two sides' names and shapes do not say: a wrapper on one side and a
bare layer on the other (the rule file decides the pairing, not the names), an in-place activation
(its budget from its input as it was before the call), and a dropout that sees [B, C, 1, 1] on one
side and [B, C] on the other (compared squeezed, never broadcast into a grid). Clean pairs pass;
the planted bug is named at its layer."""
import json

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.spec import spec_from_functions

STRATEGIES = ["full", "binary"]


def x_of(*shape):
    return lambda: (np.random.default_rng(0).standard_normal(shape).astype("float32"),)


# ------------------------------------------------------------------ a wrapper against a bare layer

class TorchPooler(torch.nn.Module):
    """As HF's BertPooler: the first position, a dense layer and a tanh."""

    def __init__(self):
        super().__init__()
        self.dense, self.activation = torch.nn.Linear(8, 8), torch.nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class TorchPooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.pooler = torch.nn.Linear(8, 8), TorchPooler()

    def forward(self, x):
        h = self.enc(x)
        return h, self.pooler(h)


class PaddlePooled(paddle.nn.Layer):
    """The port keeps a bare Linear named `pooler` and applies the tanh in its own forward."""

    def __init__(self):
        super().__init__()
        self.enc, self.pooler = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8)

    def forward(self, x):
        h = self.enc(x)
        return h, paddle.tanh(self.pooler(h[:, 0]))


POOLER_RULES = {"name": "pooler", "rules": [
    {"kind": "rename", "key": "enc.weight", "to": "enc.weight"}, {"kind": "transpose", "key": "enc.weight"},
    {"kind": "rename", "key": "enc.bias", "to": "enc.bias"},
    {"kind": "rename", "key": "pooler.dense.weight", "to": "pooler.weight"},
    {"kind": "transpose", "key": "pooler.dense.weight"},
    {"kind": "rename", "key": "pooler.dense.bias", "to": "pooler.bias"}]}


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_the_rule_file_pairs_a_wrapper_with_the_bare_layer_it_maps(tmp, train):
    rules = tmp / "rules.json"
    rules.write_text(json.dumps(POOLER_RULES))

    def torch_model():
        torch.manual_seed(0)
        return TorchPooled()
    spec = spec_from_functions(torch_model, PaddlePooled, x_of(2, 5, 8), mapping=str(rules))
    report = verify_port(spec, VerifyOptions(train=train, steps=2))
    assert report.exit_code == 0, (report.forward.first_bad, report.train and report.train.first_bad)
    pairs = {(row.torch, row.paddle) for row in report.forward.layers}
    assert ("pooler.dense", "pooler") in pairs and ("pooler", "pooler") not in pairs


# ------------------------------------------------------------------ an in-place activation

class TorchInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = torch.nn.Linear(8, 8), torch.nn.LeakyReLU(0.2, inplace=True), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class PaddleLeaky(paddle.nn.Layer):
    def __init__(self, slope):
        super().__init__()
        self.fc, self.act, self.out = paddle.nn.Linear(8, 8), paddle.nn.LeakyReLU(slope), paddle.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("slope", [0.2, 0.1], ids=["clean", "wrong-slope"])
def test_an_in_place_activation_is_budgeted_from_its_input_before_the_call(strategy, slope):
    def torch_model():
        torch.manual_seed(0)
        return TorchInPlace()
    spec = spec_from_functions(torch_model, lambda: PaddleLeaky(slope), x_of(2, 5, 8))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    if slope == 0.2:
        assert report.exit_code == 0, report.forward.first_bad
    else:
        act = report.forward.first_bad
        assert report.exit_code == 1 and act.torch == "act", act
        assert act.budget < 1e-5, act  # fp32 noise on values of order 1, not the input the call overwrote


# ------------------------------------------------------------------ [B, C, 1, 1] against [B, C]

class TorchHead(torch.nn.Module):
    """As torchvision's Inception-v3 head: pool, dropout on [B, C, 1, 1], flatten, fc."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.pool, self.dropout, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Dropout(0.5), torch.nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.dropout(self.pool(self.conv(x))), 1))


class PaddleHead(paddle.nn.Layer):
    """As paddle.vision's: pool, flatten, then dropout on [B, C]."""

    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 6, 3)
        self.pool, self.dropout, self.fc = paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Dropout(0.5), paddle.nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(self.dropout(paddle.flatten(self.pool(self.conv(x)), 1)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_outputs_that_differ_in_axes_of_size_one_are_compared_squeezed(strategy):
    def torch_model():
        torch.manual_seed(0)
        return TorchHead()
    spec = spec_from_functions(torch_model, PaddleHead, x_of(2, 3, 8, 8))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    assert report.exit_code == 0, report.forward.first_bad
    dropout = next(row for row in report.forward.layers if row.torch == "dropout")
    assert dropout.max_abs < 1e-5 and list(dropout.shape) in ([2, 6], [2, 6, 1, 1]), dropout
