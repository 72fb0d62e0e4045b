"""A mixture-of-experts router compared by what it means: torch's top-k router (HF 5's form:
softmax over the experts, then each token's top-k weights) against a paddle gate Linear that
returns the logits and leaves softmax and top-k to its block. A clean pair passes with the
router judged within its budget; a gate whose logits are off is named at the gate; a block that
normalises the top-k weights where torch does not is named at the block."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify
from helpers.experts import paddle_mixture, torch_mixture

H, E, K, T = 16, 4, 2, 12


class Qwen2MoeTopKRouter(torch.nn.Module):  # the name HF 5's class has: the router family is keyed by it
    def __init__(self):
        super().__init__()
        self.top_k, self.norm_topk_prob = K, False
        self.weight = torch.nn.Parameter(torch.randn(E, H) * 0.5)

    def forward(self, x):
        probs = torch.softmax(torch.nn.functional.linear(x.reshape(-1, H), self.weight), dim=-1, dtype=torch.float)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        return probs, top, index


class TorchMoe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Qwen2MoeTopKRouter()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(H, H) for _ in range(E)])

    def forward(self, x):
        _, top, index = self.gate(x)
        return torch_mixture(x.reshape(-1, H), index, top, self.experts).reshape(x.shape)


class PaddleMoe(paddle.nn.Layer):
    def __init__(self, normalise=False):
        super().__init__()
        self.gate = paddle.nn.Linear(H, E, bias_attr=False)
        self.experts = paddle.nn.LayerList([paddle.nn.Linear(H, H) for _ in range(E)])
        self.normalise = normalise

    def forward(self, x):
        flat = x.reshape([-1, H])
        probs = paddle.nn.functional.softmax(self.gate(flat).astype("float32"), axis=-1)
        top, index = paddle.topk(probs, K, axis=-1)
        if self.normalise:
            top = top / top.sum(axis=-1, keepdim=True)
        return paddle_mixture(flat, index, top, self.experts).reshape(x.shape)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchMoe() for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


class PaddleNet(paddle.nn.Layer):
    def __init__(self, normalise=False):
        super().__init__()
        self.blocks = paddle.nn.LayerList([PaddleMoe(normalise) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


RULES = {"name": "router", "unmatched": "keep", "rules": [{"kind": "transpose", "match": r".*\.(gate|experts\.\d+)\.weight"}]}


def _torch():
    torch.manual_seed(0)
    return TorchNet().eval()


def _inputs():
    return (np.random.default_rng(0).standard_normal((2, T // 2, H)).astype("float32"),)


def _verify(paddle_model, strategy):
    spec = spec_from_functions(_torch, paddle_model, _inputs, mapping=RULES)
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


def _scaled_gate():
    model = PaddleNet()
    gate = model.blocks[1].gate
    forward = gate.forward
    gate.forward = lambda x: forward(x) * 1.5  # a router temperature the torch model does not have
    return model


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_clean_router_is_compared_by_meaning_and_passes(strategy):
    report = _verify(PaddleNet, strategy)
    assert report.verdict == "pass", report.first_bad
    gate = next(r for r in report.layers if r.torch == "blocks.0.gate")
    assert gate.ratio is not None and gate.ratio < 0.6, gate
    assert "softmax" in gate.note and "top-2" in gate.note, gate.note


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_gate_whose_logits_are_off_is_named_at_the_gate(strategy):
    report = _verify(_scaled_gate, strategy)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "blocks.1.gate", report.first_bad


def test_weights_normalised_where_torch_does_not_are_named_at_the_block():
    report = _verify(lambda: PaddleNet(normalise=True), "full")
    assert report.verdict == "fail"
    assert report.first_bad.torch == "blocks.0", report.first_bad


class GptOssTopKRouter(torch.nn.Module):  # HF 5's GPT-OSS router: top-k of the logits, softmax over those k
    def __init__(self):
        super().__init__()
        self.top_k = K
        self.weight = torch.nn.Parameter(torch.randn(E, H) * 0.5)
        self.bias = torch.nn.Parameter(torch.randn(E) * 0.1)

    def forward(self, x):
        logits = torch.nn.functional.linear(x.reshape(-1, H), self.weight, self.bias)
        top, index = torch.topk(logits, self.top_k, dim=-1)
        return logits, torch.softmax(top, dim=1), index


class PaddleGptOssTopKRouter(paddle.nn.Layer):  # PaddleFormers' form: the top-k weights scattered over the experts
    def __init__(self, temperature=1.0):
        super().__init__()
        self.top_k, self.temperature = K, temperature
        self.weight = paddle.create_parameter([E, H], "float32")
        self.bias = paddle.create_parameter([E], "float32")

    def forward(self, x):
        logits = paddle.nn.functional.linear(x.reshape([-1, H]), self.weight.t(), self.bias) * self.temperature
        top, index = paddle.topk(logits, self.top_k, axis=-1)
        scores = paddle.put_along_axis(paddle.zeros_like(logits), index, paddle.nn.functional.softmax(top, axis=1), axis=1)
        return scores, index


PaddleGptOssTopKRouter.__name__ = "GptOssTopKRouter"  # the router family is keyed by both class names


class TorchScatteredMoe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = GptOssTopKRouter()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(H, H) for _ in range(E)])

    def forward(self, x):
        _, top, index = self.router(x)
        return x + torch_mixture(x.reshape(-1, H), index, top, self.experts).reshape(x.shape)


class PaddleScatteredMoe(paddle.nn.Layer):
    def __init__(self, temperature=1.0):
        super().__init__()
        self.router = PaddleGptOssTopKRouter(temperature)
        self.experts = paddle.nn.LayerList([paddle.nn.Linear(H, H) for _ in range(E)])

    def forward(self, x):
        scores, _ = self.router(x)
        flat = x.reshape([-1, H])
        out = paddle.zeros_like(flat)
        for e in range(E):
            out = out + scores[:, e : e + 1] * self.experts[e](flat)
        return x + out.reshape(x.shape)


SCATTERED_RULES = {"name": "router", "unmatched": "keep", "rules": [{"kind": "transpose", "match": r".*experts\.\d+\.weight"}]}


def _verify_scattered(paddle_model):
    def build_torch():
        torch.manual_seed(0)
        return TorchScatteredMoe().eval()
    spec = spec_from_functions(build_torch, paddle_model, _inputs, mapping=SCATTERED_RULES)
    return verify(spec, Options(device="cpu", strategy="full"), bisect=True)


def test_scattered_top_k_weights_are_compared_by_meaning_and_pass():
    report = _verify_scattered(PaddleScatteredMoe)
    assert report.verdict == "pass", report.first_bad
    router = next(r for r in report.layers if r.torch == "router")
    assert router.ratio is not None and router.ratio < 0.6, router
    assert "scattered" in router.note and "top-2" in router.note, router.note


def test_scattered_weights_from_logits_that_are_off_are_named_at_the_router():
    report = _verify_scattered(lambda: PaddleScatteredMoe(temperature=1.5))
    assert report.verdict == "fail"
    assert report.first_bad.torch == "router", report.first_bad
