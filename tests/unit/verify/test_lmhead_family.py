"""PaddleFormers' LMHead as a layer family: a torch Linear ported as a paddle layer of that class
keeps HF's [vocab, hidden] weight (not transposed, unlike a paddle Linear) and multiplies by its
transpose. The paddle class here computes what PaddleFormers 1.2's LMHead computes
(paddleformers/nn/lm_head.py: matmul(hidden_states, weight, transpose_y=True) plus an optional
bias); the side environment's suite runs the real one."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.session import Options
from converter.families import kind_of, lookup, lookup_paddle
from converter.families.lmhead import transposed
from converter.rules.infer import infer_ruleset
from converter.spec import spec_from_functions
from converter.verify.run import verify

H, VOCAB = 16, 24


class LMHead(paddle.nn.Layer):
    def __init__(self, hidden, vocab, bias=False):
        super().__init__()
        self.weight = self.create_parameter([vocab, hidden])
        self.bias = self.create_parameter([vocab], is_bias=True) if bias else None

    def forward(self, hidden_states):
        logits = paddle.matmul(hidden_states, self.weight, transpose_y=True)
        return logits if self.bias is None else logits + self.bias


class TorchLM(torch.nn.Module):
    def __init__(self, vocab=VOCAB, bias=False):
        super().__init__()
        self.proj, self.lm_head = torch.nn.Linear(H, H), torch.nn.Linear(H, vocab, bias=bias)

    def forward(self, x):
        return self.lm_head(torch.tanh(self.proj(x)))


class PaddleLM(paddle.nn.Layer):
    def __init__(self, vocab=VOCAB, bias=False):
        super().__init__()
        self.proj, self.lm_head = paddle.nn.Linear(H, H), LMHead(H, vocab, bias)

    def forward(self, x):
        return self.lm_head(paddle.tanh(self.proj(x)))


def _torch(vocab=VOCAB, bias=False):
    torch.manual_seed(0)
    return TorchLM(vocab, bias)


def inputs():
    return (np.random.default_rng(0).standard_normal((2, 5, H)).astype(np.float32),)


def test_a_torch_linear_ported_as_an_lmhead_has_that_family_and_a_linear_elsewhere():
    t, p = _torch(), PaddleLM()
    assert lookup(t.lm_head, p.lm_head).name == "paddleformers-lmhead"
    assert lookup(t.lm_head).name == lookup(t.proj, p.proj).name == "linear"
    assert lookup_paddle(p.lm_head).name == "paddleformers-lmhead" and kind_of("LMHead") == kind_of("Linear")


@pytest.mark.parametrize("bias", [False, True])
def test_inferred_rules_keep_the_head_untransposed_and_the_port_passes(bias):
    t, p = _torch(bias=bias), PaddleLM(bias=bias)
    rules = infer_ruleset(t, p).rules
    transposes = {r.spec.get("key") for r in rules if r.kind == "transpose"}
    assert transposes == {"proj.weight"}, transposes
    report = verify(spec_from_functions(lambda: _torch(bias=bias), lambda: PaddleLM(bias=bias), inputs),
                    Options(device="cpu", strategy="full"), bisect=True)
    assert report.verdict == "pass", [(r.torch, r.ratio) for r in report.layers]
    head = {r.torch: r for r in report.layers}["lm_head"]
    assert head.paddle == "lm_head" and head.paddle_type == "LMHead" and head.ratio is not None and head.within_budget


def test_a_square_head_holding_torch_weight_transposed_is_said_so():
    t, p = _torch(vocab=H), PaddleLM(vocab=H)
    w = t.lm_head.weight.detach().numpy()
    p.lm_head.weight.set_value(w.T.copy())
    found = transposed(None, "lm_head", t.lm_head, p.lm_head)
    assert len(found) == 1 and "transposed" in found[0].cause and found[0].kind == "transpose"
    p.lm_head.weight.set_value(w.copy())
    assert transposed(None, "lm_head", t.lm_head, p.lm_head) == []
