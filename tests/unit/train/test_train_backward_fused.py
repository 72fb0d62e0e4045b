"""The torch modules one paddle layer fuses (q|k|v in one Linear) are compared in the per-layer
backward as one unit: run together on their one input, their output gradients laid out as the
fused output holds them, each paddle parameter's gradient against torch's through the plan. A
clean pair agrees there; a gradient halved inside the fused layer is named at it, not at its parent."""

import json

import numpy as np
import paddle
import pytest
import torch

from converter.spec import PortSpec
from helpers.train import train_check

H, C, B, STEPS = 8, 5, 6, 2
UNIT = "q_proj+k_proj+v_proj"


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(H, H) for _ in range(3))
        self.head = torch.nn.Linear(H, C)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.q_proj(x)) * torch.sigmoid(self.k_proj(x)) + self.v_proj(x))


class Half(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, w):
        return w.clone()

    @staticmethod
    def backward(ctx, dw):
        return dw * 0.5


class HalvedWeightLinear(paddle.nn.Linear):
    def forward(self, x):
        return paddle.nn.functional.linear(x, Half.apply(self.weight), self.bias)


class PaddleNet(paddle.nn.Layer):
    def __init__(self, linear=paddle.nn.Linear):
        super().__init__()
        self.qkv = linear(H, 3 * H)
        self.head = paddle.nn.Linear(H, C)

    def forward(self, x):
        q, k, v = paddle.split(self.qkv(x), 3, axis=-1)
        return self.head(paddle.nn.functional.gelu(q) * paddle.nn.functional.sigmoid(k) + v)


RULES = {"name": "fused-qkv", "unmatched": "keep", "rules": [
    {"kind": "merge", "match": [r"q_proj\.(weight|bias)", r"k_proj\.(weight|bias)", r"v_proj\.(weight|bias)"],
     "to": r"qkv.\1", "axis": -1},
    {"kind": "transpose", "match": r"(?:q_proj|k_proj|v_proj|head)\.weight"},
]}


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("fused") / "fused.json"
    path.write_text(json.dumps(RULES))
    return str(path)


def _report(rules, linear):
    rng = np.random.default_rng(1)
    batches = [((rng.standard_normal((B, H)).astype(np.float32),), rng.integers(0, C, B).astype(np.int64))
               for _ in range(STEPS)]
    spec = PortSpec(TorchNet, lambda: PaddleNet(linear), (np.random.default_rng(0).standard_normal((B, H))
                                                          .astype(np.float32),), mapping=rules, batches=batches,
                    torch_loss=torch.nn.functional.cross_entropy, paddle_loss=paddle.nn.functional.cross_entropy,
                    torch_optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), label="fused-qkv")
    return train_check(spec, steps=STEPS, device="cpu")


def _unit_rows(report) -> dict:
    return {r.paddle: r for r in report.rows if r.phase == "backward" and r.note.endswith(f"local backward of {UNIT}")}


def test_the_fused_modules_are_one_unit_of_the_backward_and_a_clean_pair_agrees(rules):
    report = _report(rules, paddle.nn.Linear)
    rows = _unit_rows(report)
    assert set(rows) == {"qkv d input[0]", "qkv.weight", "qkv.bias"}, sorted(rows)
    assert rows["qkv.weight"].torch == "q_proj.weight+k_proj.weight+v_proj.weight"
    assert all(r.ratio is not None and r.ratio <= 1 for r in rows.values()), rows
    assert report.first_bad is None, report.first_bad


def test_a_gradient_halved_inside_the_fused_layer_is_named_at_it(rules):
    report = _report(rules, HalvedWeightLinear)
    fb = report.first_bad
    assert fb is not None and fb.phase == "backward" and fb.paddle == "qkv.weight", fb
    assert fb.note.endswith(f"local backward of {UNIT}")
    assert not _unit_rows(report)["qkv d input[0]"].bad
    found = report.diagnosis[0]
    assert found.kind == "custom backward" and found.layer == UNIT and "times 0.5" in found.cause, report.diagnosis
