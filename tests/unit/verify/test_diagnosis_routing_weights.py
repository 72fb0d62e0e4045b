"""Routing weights applied to other tokens, named at the experts: torch's experts take HF 5's form
(an experts module called with the hidden states, each token's chosen experts and their weights,
looping over the experts it chose); paddle's run every expert on every token and weigh them by
the weights scattered to [tokens, experts], turned to [experts, tokens] by a transpose, or (the
bug) by a reshape. The what-if re-runs torch's experts with the weights read so; a different
mix-up of the weights gets no routing diagnosis."""

import numpy as np
import paddle
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

TOKENS, D, E, K = 12, 8, 4, 2


class Experts(torch.nn.Module):
    """HF 5's experts form: `num_experts`, called with the chosen experts and their weights."""

    def __init__(self):
        super().__init__()
        self.num_experts = E
        self.weight = torch.nn.Parameter(torch.randn(E, D, D) / D ** 0.5)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for expert in range(self.num_experts):
            position, token = torch.where(mask[expert])
            y = torch.tanh(hidden_states[token] @ self.weight[expert])
            out.index_add_(0, token, y * top_k_weights[token, position, None])
        return out


class MoeExperts(paddle.nn.Layer):
    """Every expert on every token, weighed by the scattered weights turned to [experts, tokens]."""

    def __init__(self, turned):
        super().__init__()
        self.weight = self.create_parameter([E, D, D])
        self.turned = turned

    def forward(self, hidden_states, top_k_index, scattered):
        y = paddle.tanh(paddle.bmm(paddle.tile(hidden_states[None], [E, 1, 1]), self.weight))
        return (y * self.turned(scattered)[..., None]).sum(axis=0)


class TorchMoe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate = torch.nn.Linear(D, E)
        self.experts = Experts()

    def forward(self, x):
        top, index = torch.topk(self.gate(x), K, dim=-1)
        return self.experts(x, index, torch.softmax(top, dim=-1))


class PaddleMoe(paddle.nn.Layer):
    def __init__(self, turned):
        super().__init__()
        self.gate = paddle.nn.Linear(D, E)
        self.experts = MoeExperts(turned)

    def forward(self, x):
        top, index = paddle.topk(self.gate(x), K, axis=-1)
        scattered = paddle.put_along_axis(paddle.zeros([x.shape[0], E]), index, paddle.nn.functional.softmax(top, -1), 1)
        return self.experts(x, index, scattered)


RULES = {"name": "moe", "unmatched": "keep", "rules": [{"kind": "transpose", "match": r"gate\.weight"}]}
TURNED = {"transposed": lambda w: w.transpose([1, 0]), "reshaped": lambda w: w.reshape([E, -1]),
          "tokens reversed": lambda w: w.flip(0).transpose([1, 0])}


def _verify(turned):
    inputs = lambda: (np.random.default_rng(0).standard_normal((TOKENS, D)).astype("float32"),)
    spec = spec_from_functions(lambda: TorchMoe().eval(), lambda: PaddleMoe(TURNED[turned]), inputs, mapping=RULES)
    return verify(spec, Options(device="cpu"), bisect=True)


def test_experts_that_transpose_the_weights_pass():
    report = _verify("transposed")
    assert report.verdict == "pass", (report.first_bad, report.notes[:3])


def test_weights_reshaped_instead_of_transposed_are_named_as_applied_to_other_tokens():
    report = _verify("reshaped")
    assert report.verdict == "fail" and report.first_bad.torch == "experts", report.first_bad
    found = [d for d in report.diagnosis if d.kind == "routing weights"]
    assert len(found) == 1 and found[0].layer == "experts", report.diagnosis
    assert f"({TOKENS} x {E}) and then read as [experts, tokens]" in found[0].cause, found[0]


def test_another_mix_up_of_the_weights_gets_no_routing_diagnosis():
    report = _verify("tokens reversed")
    assert report.verdict == "fail" and report.first_bad.torch == "experts", report.first_bad
    assert not any(d.kind == "routing weights" for d in report.diagnosis), report.diagnosis
