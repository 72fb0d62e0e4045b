"""Diagnosis checks that the planted-bug suites do not reach: each fires on its pitfall and
stays silent without it."""

import pytest
import types

import numpy as np
import paddle
import torch

from converter.verify.report import LayerResult


def test_batchnorm_momentum_convention():
    from converter.families.norm import momentum_convention
    torch_bn = torch.nn.BatchNorm2d(4, momentum=0.1)
    found = momentum_convention(None, "bn", torch_bn, paddle.nn.BatchNorm2D(4, momentum=0.1))
    assert len(found) == 1 and "momentum=0.9" in found[0].hint
    assert momentum_convention(None, "bn", torch_bn, paddle.nn.BatchNorm2D(4, momentum=0.9)) == []


class _TiedTorch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied


def _tied_context(paddle_head):
    torch.manual_seed(0)
    model = _TiedTorch()
    session = types.SimpleNamespace(torch_model=model)
    return types.SimpleNamespace(session=session, result=LayerResult("head", "head", "Linear", "Linear", (2, 10)),
                                 paddle_layer=paddle_head, name="head"), model


def test_a_tied_head_that_paddle_no_longer_shares():
    from converter.verify.diagnose_model import check_tied
    head = paddle.nn.Linear(4, 10, bias_attr=False)
    ctx, model = _tied_context(head)
    found = check_tied(ctx)
    assert len(found) == 1 and "ties 'head.weight' to 'emb.weight'" in found[0].cause
    head.weight.set_value(model.emb.weight.detach().numpy().T.copy())  # the tie kept: [in, out]
    assert check_tied(ctx) == []


class _TorchAct(torch.nn.Module):  # a class no family covers, as HF's activation classes
    def forward(self, x):
        return torch.nn.functional.gelu(x)


class _PaddleAct(paddle.nn.Layer):
    def forward(self, x):
        return paddle.nn.functional.gelu(x, approximate=True)


class _Torch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense, self.act = torch.nn.Linear(8, 8), _TorchAct()

    def forward(self, x):
        return self.act(self.dense(x))


class _Paddle(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.dense, self.act = paddle.nn.Linear(8, 8), _PaddleAct()

    def forward(self, x):
        return self.act(self.dense(x))


def test_an_activation_class_no_family_covers_is_diagnosed_by_what_it_computes():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options

    def torch_model():
        torch.manual_seed(0)
        return _Torch()
    x = (np.random.default_rng(0).standard_normal((4, 8)) * 2).astype(np.float32)
    report = verify(spec_from_functions(torch_model, _Paddle, lambda: (x,)), Options(device="cpu"), bisect=True)
    assert report.first_bad.torch == "act"
    assert any("GELU (tanh approximation)" in d.cause and "GELU (exact" in d.cause and "approximate=False" in d.hint
               for d in report.diagnosis), report.diagnosis


class _PaddleRelu(paddle.nn.Layer):
    def forward(self, x):
        return paddle.nn.functional.relu(x)


class _PaddleWithRelu(_Paddle):
    def __init__(self):
        super().__init__()
        self.act = _PaddleRelu()


def test_another_activation_gets_a_hint_to_compute_torchs():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options

    def torch_model():
        torch.manual_seed(0)
        return _Torch()
    x = (np.random.default_rng(0).standard_normal((4, 8)) * 2).astype(np.float32)
    report = verify(spec_from_functions(torch_model, _PaddleWithRelu, lambda: (x,)), Options(device="cpu"), bisect=True)
    found = [d for d in report.diagnosis if "activation variant" in d.cause]
    assert found and "paddle computes ReLU where torch computes GELU (exact, erf)" in found[0].cause, report.diagnosis
    assert "compute GELU (exact, erf) in paddle" in found[0].hint and "approximate" not in found[0].hint, found[0]


def _signatures():
    import importlib.util

    from helpers.cli import spec_path
    spec = importlib.util.spec_from_file_location("signatures_for_padding", spec_path("signatures"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _signatures()


def _attend(attn, h, mask):
    b, t, _ = h.shape
    split = lambda x: x.view(b, t, S.HEADS, attn.head_dim).transpose(1, 2)
    q, k, v = split(attn.q_proj(h)), split(attn.k_proj(h)), split(attn.v_proj(h))
    scores = q @ k.transpose(-1, -2) / attn.head_dim ** 0.5 + mask
    scores = scores.masked_fill(~attn.bias[:t, :t], float("-inf"))
    return attn.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, S.H))


class _TorchPaddedAttention(S.TorchAttention):
    def forward(self, hidden_states, attention_mask):
        return _attend(self, hidden_states, attention_mask)


class _TorchPaddedModel(S.TorchModel):
    def __init__(self):
        super().__init__()
        self.attn = _TorchPaddedAttention()

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids)
        extended = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        return self.head(self.norm(h + self.attn(h, extended)))


class _PaddlePaddedModel(S.PaddleModel):
    def forward(self, input_ids, attention_mask):  # the padding mask is never passed on: the bug
        h = self.emb(input_ids)
        t = input_ids.shape[1]
        mask = paddle.triu(paddle.full([t, t], -1e4, dtype="float32"), diagonal=1).reshape([1, 1, t, t])
        return self.head(self.norm(h + self.attn(h, h, h, mask)))


@pytest.mark.slow


def test_attention_that_ignores_the_padding_mask():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    ids = S.inputs()["input_ids"]
    keep = np.ones_like(ids)
    keep[0, -3:] = 0  # the first sequence ends in three padding tokens

    def torch_model():
        torch.manual_seed(0)
        return _TorchPaddedModel()
    spec = spec_from_functions(torch_model, _PaddlePaddedModel, lambda: {"input_ids": ids, "attention_mask": keep})
    report = verify(spec, Options(device="cpu"), bisect=True)
    assert report.first_bad.torch == "attn", [(r.torch, r.ratio) for r in report.layers if r.within_budget is False]
    assert any("padding mask" in d.cause for d in report.diagnosis), report.diagnosis


class _TorchShift(torch.nn.Module):  # a leaf no family covers and no what-if explains
    def forward(self, x):
        return x * torch.sigmoid(x)


class _PaddleShift(paddle.nn.Layer):
    def forward(self, x):
        return x * paddle.nn.functional.sigmoid(x) + 0.01 * paddle.cos(x)  # the bug


class _TorchWithShift(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense, self.shift = torch.nn.Linear(8, 8), _TorchShift()

    def forward(self, x):
        return self.shift(self.dense(x))


class _PaddleWithShift(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.dense, self.shift = paddle.nn.Linear(8, 8), _PaddleShift()

    def forward(self, x):
        return self.shift(self.dense(x))


def test_a_layer_no_known_pitfall_explains_gets_the_fallback_naming_both_classes():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options

    def torch_model():
        torch.manual_seed(0)
        return _TorchWithShift()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    report = verify(spec_from_functions(torch_model, _PaddleWithShift, lambda: (x,)), Options(device="cpu"),
                    bisect=True)
    assert report.first_bad.torch == "shift"
    assert [d.cause for d in report.diagnosis] == ["no known porting pitfall fits this layer"], report.diagnosis
    assert "_TorchShift" in report.diagnosis[0].hint and "_PaddleShift" in report.diagnosis[0].hint
