"""A paddle parameter fused from several torch tensors (q|k|v in one Linear) is in the
teacher-forced optimizer check, laid out as the conversion plan says: under AdamW with global-norm
clipping the clean pair passes (the global norm counts every parameter on both sides), and a planted
optimizer bug is named at the fused parameter with the setting that differs."""

import json

import numpy as np
import paddle
import pytest
import torch

from converter.spec import PortSpec
from helpers.train import train_check

H, C, B, STEPS, CLIP = 8, 5, 6, 4, 0.5
QKV = "q_proj.weight+k_proj.weight+v_proj.weight"


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(H, H) for _ in range(3))
        self.head = torch.nn.Linear(H, C)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.q_proj(x)) * torch.sigmoid(self.k_proj(x)) + self.v_proj(x)
        return self.head(h)


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.qkv = paddle.nn.Linear(H, 3 * H)
        self.head = paddle.nn.Linear(H, C)

    def forward(self, x):
        q, k, v = paddle.split(self.qkv(x), 3, axis=-1)
        return self.head(paddle.nn.functional.gelu(q) * paddle.nn.functional.sigmoid(k) + v)


RULES = {"name": "fused-qkv", "unmatched": "keep", "rules": [
    {"kind": "merge", "match": [r"q_proj\.(weight|bias)", r"k_proj\.(weight|bias)", r"v_proj\.(weight|bias)"],
     "to": r"qkv.\1", "axis": -1},
    {"kind": "transpose", "match": r"(?:q_proj|k_proj|v_proj|head)\.weight"},
]}


def _torch_model():
    torch.manual_seed(0)
    return TorchNet()


def _batches():
    rng = np.random.default_rng(1)
    return [((rng.standard_normal((B, H)).astype(np.float32),), rng.integers(0, C, B).astype(np.int64))
            for _ in range(STEPS)]


def _torch_adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-2, betas=(0.9, 0.999), weight_decay=0.05)


def _spec(rules, paddle_optimizer=None):
    return PortSpec(_torch_model, PaddleNet, lambda: (np.random.default_rng(0).standard_normal((B, H))
                                                      .astype(np.float32),), mapping=rules, batches=_batches,
                    torch_loss=torch.nn.functional.cross_entropy, paddle_loss=paddle.nn.functional.cross_entropy,
                    torch_optimizer=_torch_adamw, paddle_optimizer=paddle_optimizer, clip_grad_norm=CLIP,
                    label="fused-qkv")


def _paddle_adamw(**settings):
    def build(model):
        args = dict(learning_rate=3e-2, beta1=0.9, beta2=0.999, weight_decay=0.05, parameters=model.parameters(),
                    grad_clip=paddle.nn.ClipGradByGlobalNorm(CLIP))
        args.update(settings)
        return paddle.optimizer.AdamW(**args)
    return build


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("fused") / "fused.json"
    path.write_text(json.dumps(RULES))
    return str(path)


def _clipped_norms() -> list:
    """The global gradient norm torch clips at each step of its own run (the test is about clipping)."""
    model, norms = _torch_model(), []
    opt = _torch_adamw(model)
    for (x,), y in _batches():
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
    return norms


@pytest.mark.parametrize("paddle_optimizer", [None, _paddle_adamw()], ids=["translated", "given"])
def test_a_clean_fused_pair_passes_with_the_fused_parameter_in_the_optimizer_check(rules, paddle_optimizer):
    assert min(_clipped_norms()) > CLIP  # clipping acts at every step: the global norm must count qkv
    report = train_check(_spec(rules, paddle_optimizer), steps=STEPS, device="cpu")
    assert report.first_bad is None, (report.first_bad, report.diagnosis)
    fused = [r for r in report.rows if r.phase == "optimizer" and r.paddle.startswith("qkv.weight")]
    # the parameter and both Adam moments, at every teacher-forced step
    assert {(r.step, r.paddle) for r in fused} == {(k, "qkv.weight" + what) for k in range(STEPS)
                                                    for what in ("", " moment1", " moment2")}
    assert all(r.torch.startswith(QKV) and r.ratio is not None and r.ratio <= 1 for r in fused), fused
    assert {r.paddle for r in report.rows if r.phase == "optimizer" and r.step == 0} >= {"qkv.bias", "head.weight",
                                                                                          "head.bias"}


@pytest.mark.parametrize("settings, words", [
    ({"beta2": 0.99}, ["beta1/beta2", "0.999", "0.99"]),
    ({"weight_decay": 0.0}, ["weight decay", "0.05"]),
], ids=["beta2", "weight-decay-on-torch-only"])
def test_a_planted_optimizer_bug_is_named_at_the_fused_parameter(rules, settings, words):
    report = train_check(_spec(rules, _paddle_adamw(**settings)), steps=STEPS, device="cpu")
    fb = report.first_bad
    assert fb is not None and fb.phase == "optimizer", fb
    assert fb.paddle.startswith("qkv.") and fb.torch.startswith(QKV.replace("weight", fb.paddle.split(".")[1]
                                                                            .split(" ")[0])), fb
    assert [d.kind for d in report.diagnosis] == ["optimizer"], report.diagnosis
    cause = report.diagnosis[0].cause
    assert "reproduces paddle's step" in cause and all(w in cause for w in words), cause
    assert report.diagnosis[0].layer == fb.torch
