"""A grouped mixture-of-experts router compared by what it means: torch's router returns its logits
and its block routes them (HF 5's DeepSeek-V3 form: sigmoid scores, a score-correction bias for
the choice, the best groups, the top-k experts of those, their scores normalised and scaled); the
paddle router routes itself and returns the chosen experts and their weights (PaddleFormers'
form). Both are read as each token's routing weights: a clean pair passes with the router judged
within its budget; a router that scales by another factor, or chooses without its bias, is named
at the router."""

import types

import numpy as np
import paddle
import pytest
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify
from helpers.experts import paddle_mixture, torch_mixture

H, E, GROUPS, TOP_GROUPS, K, T = 16, 8, 4, 2, 2, 12
CONFIG = types.SimpleNamespace(hidden_size=H, n_routed_experts=E, n_group=GROUPS, topk_group=TOP_GROUPS,
                               num_experts_per_tok=K, norm_topk_prob=True, routed_scaling_factor=2.5)


class DeepseekV3TopkRouter(torch.nn.Module):  # the name HF 5's class has: the grouped router family is keyed by it
    def __init__(self):
        super().__init__()
        self.config = CONFIG
        self.weight = torch.nn.Parameter(torch.randn(E, H) * 0.3)
        self.register_buffer("e_score_correction_bias", torch.randn(E) * 0.2)

    def forward(self, x):
        return torch.nn.functional.linear(x.reshape(-1, H).float(), self.weight.float())


class TorchMoe(torch.nn.Module):
    """HF 5's DeepSeek-V3 block: the router's logits routed here."""

    def __init__(self):
        super().__init__()
        self.gate = DeepseekV3TopkRouter()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(H, H) for _ in range(E)])

    def route(self, logits):
        scores = logits.sigmoid()
        choice = scores + self.gate.e_score_correction_bias
        group_scores = choice.view(-1, GROUPS, E // GROUPS).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=TOP_GROUPS, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, GROUPS, E // GROUPS).reshape(-1, E)
        index = torch.topk(choice.masked_fill(~score_mask.bool(), 0.0), k=K, dim=-1, sorted=False)[1]
        weights = scores.gather(1, index)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return index, weights * CONFIG.routed_scaling_factor

    def forward(self, x):
        index, weights = self.route(self.gate(x))
        return x + torch_mixture(x.reshape(-1, H), index, weights, self.experts).reshape(x.shape)


class PaddleTopkRouter(paddle.nn.Layer):
    """PaddleFormers' form: the router routes, and returns the chosen experts and their weights."""

    def __init__(self, scale=CONFIG.routed_scaling_factor, bias_in_choice=True):
        super().__init__()
        self.scale, self.bias_in_choice = scale, bias_in_choice
        self.weight = paddle.create_parameter([E, H], "float32")
        self.register_buffer("e_score_correction_bias", paddle.zeros([E], "float32"))

    def forward(self, x):
        scores = paddle.nn.functional.sigmoid(paddle.matmul(x.reshape([-1, H]), self.weight, transpose_y=True))
        choice = scores + self.e_score_correction_bias.unsqueeze(0) if self.bias_in_choice else scores
        group_scores = choice.reshape([-1, GROUPS, E // GROUPS]).topk(2, axis=-1)[0].sum(axis=-1)
        group_idx = paddle.topk(group_scores, k=TOP_GROUPS, axis=-1)[1]
        group_mask = paddle.put_along_axis(paddle.zeros_like(group_scores), group_idx, 1.0, axis=1)
        score_mask = group_mask.unsqueeze(-1).expand([-1, GROUPS, E // GROUPS]).reshape([-1, E])
        index = paddle.topk(paddle.where(score_mask > 0, choice, paddle.zeros_like(choice)), k=K, axis=-1)[1]
        weights = paddle.take_along_axis(scores, index, axis=1)
        weights = weights / (weights.sum(axis=-1, keepdim=True) + 1e-20)
        return index, weights * self.scale


PaddleTopkRouter.__name__ = "DeepseekV3TopkRouter"  # the family is keyed by both class names


class PaddleMoe(paddle.nn.Layer):
    def __init__(self, **router):
        super().__init__()
        self.gate = PaddleTopkRouter(**router)
        self.experts = paddle.nn.LayerList([paddle.nn.Linear(H, H) for _ in range(E)])

    def forward(self, x):
        index, weights = self.gate(x)
        return x + paddle_mixture(x.reshape([-1, H]), index, weights, self.experts).reshape(x.shape)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchMoe() for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class PaddleNet(paddle.nn.Layer):
    def __init__(self, second=None):
        super().__init__()
        self.blocks = paddle.nn.LayerList([PaddleMoe(), PaddleMoe(**(second or {}))])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


RULES = {"name": "grouped-router", "unmatched": "keep", "rules": [{"kind": "transpose", "match": r".*experts\.\d+\.weight"}]}


def _torch():
    torch.manual_seed(0)
    return TorchNet().eval()


def _inputs():
    return (np.random.default_rng(0).standard_normal((2, T // 2, H)).astype("float32"),)


def _verify(second=None, strategy="full"):
    spec = spec_from_functions(_torch, lambda: PaddleNet(second), _inputs, mapping=RULES)
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_clean_grouped_router_is_compared_as_the_routing_and_passes(strategy):
    report = _verify(strategy=strategy)
    assert report.verdict == "pass", report.first_bad
    gates = [r for r in report.layers if r.torch.endswith(".gate")]
    assert [g.torch for g in gates] == ["blocks.0.gate", "blocks.1.gate"], [r.torch for r in report.layers]
    for gate in gates:
        assert gate.ratio is not None and gate.ratio < 1 and gate.shape == (T, K), gate
        assert "routed as its block routes them" in gate.note and "best 2 of 4 groups" in gate.note, gate.note


@pytest.mark.parametrize("second", [{"scale": 1.0}, {"bias_in_choice": False}], ids=["scaled-by-one", "no-bias-in-choice"])
def test_a_router_bug_is_named_at_the_router(second):
    report = _verify(second)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "blocks.1.gate", report.first_bad
    first = next(r for r in report.layers if r.torch == "blocks.0.gate")
    assert first.ratio is not None and first.ratio < 1, first


def test_a_router_whose_products_paddle_rounds_to_bf16_is_within_the_bf16_budget_of_the_routing():
    """The rounding effect of bf16 is measured on the routing too: torch's router run in float64
    with its products' inputs rounded, then routed."""
    spec = spec_from_functions(_torch, PaddleNet, _inputs, mapping=RULES)
    report = verify(spec, Options(device="cpu", emulate={"paddle": "bf16"}), bisect=True)
    gates = [r for r in report.layers if r.torch.endswith(".gate")]
    assert len(gates) == 2 and all(g.local_max_abs > 1e-4 for g in gates), gates  # bf16's rounding shows
    assert all(g.ratio is not None and g.ratio < 1 for g in gates), gates


def test_a_router_on_the_meta_device_has_no_reading_until_its_bias_is_there():
    """A torch model built on the meta device (its weights streamed) holds no bias to route with."""
    from converter.families.router import GroupedRouting
    with torch.device("meta"):
        streamed = DeepseekV3TopkRouter()
    assert GroupedRouting.of_module(streamed) is None
    reading = GroupedRouting.of_module(DeepseekV3TopkRouter())
    assert reading is not None and (reading.top_k, reading.n_group, reading.topk_group) == (K, GROUPS, TOP_GROUPS)
