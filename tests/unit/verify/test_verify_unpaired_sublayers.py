"""A block whose experts torch holds as one module of stacked weights and paddle as a layer per
expert (HF 5 against PaddleFormers): neither side's experts have a counterpart, so a bug inside
paddle's experts is named at the block, by both strategies, and the block's own-forward diagnosis
names each side's experts as compared only as part of its output. A block whose sublayers all
have a counterpart names none."""

import json

import numpy as np
import paddle
import pytest
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

D, EXPERTS = 16, 3
RULES = {"name": "stacked-experts", "unmatched": "keep", "rules": [
    {"kind": "unstack", "match": r"(.*)\.experts\.w", "index": "e", "to": r"\1.experts.\g<e>.lin.weight"},
    {"kind": "transpose", "match": r".*\.proj\.weight"},
]}
SCALE = 1.3  # the planted bug: a factor torch's model does not have


class TorchExperts(torch.nn.Module):
    """Every expert on every token, averaged: expert e is tanh(x @ w[e]) ([in, out] per expert)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(EXPERTS, D, D) * 0.3)

    def forward(self, x):
        return sum(torch.tanh(x @ self.w[e]) for e in range(EXPERTS)) / EXPERTS


class TorchBlock(torch.nn.Module):
    def __init__(self, experts: bool):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.experts = TorchExperts() if experts else None

    def forward(self, x):
        h = self.proj(x)
        return h + (self.experts(h) if self.experts is not None else torch.tanh(h))


class PaddleExpert(paddle.nn.Layer):
    def __init__(self, scale: float):
        super().__init__()
        self.lin = paddle.nn.Linear(D, D, bias_attr=False)
        self.scale = scale

    def forward(self, x):
        return paddle.tanh(self.lin(x) * self.scale)


class PaddleBlock(paddle.nn.Layer):
    """With experts: the second scales its input by `scale`; without: the block scales tanh's
    output by `scale` in its own code."""

    def __init__(self, experts: bool, scale: float = 1.0):
        super().__init__()
        self.proj = paddle.nn.Linear(D, D)
        self.experts = paddle.nn.LayerList([PaddleExpert(scale if e == 1 else 1.0) for e in range(EXPERTS)]) \
            if experts else None
        self.scale = scale

    def forward(self, x):
        h = self.proj(x)
        if self.experts is None:
            return h + paddle.tanh(h) * self.scale
        return h + sum(expert(h) for expert in self.experts) / EXPERTS


class TorchNet(torch.nn.Module):
    def __init__(self, experts: bool):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchBlock(experts) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class PaddleNet(paddle.nn.Layer):
    """Two blocks, the bug in the second."""

    def __init__(self, experts: bool, scale: float):
        super().__init__()
        self.blocks = paddle.nn.LayerList([PaddleBlock(experts), PaddleBlock(experts, scale)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _inputs():
    return (np.random.default_rng(0).standard_normal((2, 5, D)).astype("float32"),)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "stacked.json"
    path.write_text(json.dumps(RULES))
    return str(path)


def _verify(experts: bool, scale: float, rules, strategy="full"):
    def torch_model():
        torch.manual_seed(0)
        return TorchNet(experts).eval()
    spec = spec_from_functions(torch_model, lambda: PaddleNet(experts, scale), _inputs, mapping=rules)
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


def test_the_clean_pair_passes(rules):
    report = _verify(True, 1.0, rules)
    assert report.verdict == "pass", report.first_bad


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_bug_inside_experts_without_a_counterpart_names_each_sides_experts(strategy, rules):
    report = _verify(True, SCALE, rules, strategy)
    assert report.verdict == "fail" and report.first_bad.torch == "blocks.1", report.first_bad
    [own] = [d for d in report.diagnosis if d.kind == "own forward"]
    assert "torch's blocks.1.experts (TorchExperts), paddle's blocks.1.experts (LayerList)" in own.cause, own
    assert own.hint.startswith("compare those sublayers and its own forward line by line"), own


def test_a_block_whose_sublayers_all_have_a_counterpart_names_none(rules):
    report = _verify(False, SCALE, rules)
    assert report.verdict == "fail" and report.first_bad.torch == "blocks.1", report.first_bad
    [own] = [d for d in report.diagnosis if d.kind == "own forward"]
    assert own.cause.endswith("every paired sublayer inside it is within budget"), own
    assert own.hint.startswith("compare its forward line by line"), own
