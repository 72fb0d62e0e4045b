"""A convention a paddle loss evens out is said once in the training report's notes: paddle 3.3's
cross_entropy with ignore_index and reduction "mean" divides by every label, the ignored ones
included (torch's by those counted), which the directories' causal-LM loss (converter/hf/pair.py)
corrects on paddle's side. The divergence itself is checked on the paddle installed."""

import numpy as np
import paddle
import pytest
import torch

from converter import PortSpec, VerifyOptions, verify_port
from converter.hf.pair import IGNORED, _paddle_causal_loss, _torch_causal_loss
from converter.report import render_text

V, D, B, T = 11, 8, 2, 6


class TorchLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(V, D), torch.nn.Linear(D, V)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))


class PaddleLM(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed, self.head = paddle.nn.Embedding(V, D), paddle.nn.Linear(D, V)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))


def _inputs():
    return {"input_ids": np.random.default_rng(0).integers(0, V, (B, T)).astype(np.int64)}


def _labels():
    labels = _inputs()["input_ids"].copy()
    labels[1, -3:] = IGNORED  # the second row's padded positions
    return labels


def test_paddle_s_ignore_index_mean_divides_by_every_label():
    logits = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    labels = np.array([0, 1, IGNORED, IGNORED])
    mean = float(paddle.nn.functional.cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels),
                                                    ignore_index=IGNORED))
    each = paddle.nn.functional.cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels),
                                              ignore_index=IGNORED, reduction="none").numpy()
    torch_mean = float(torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels)))
    if not paddle.__version__.startswith("3.3"):
        pytest.skip(f"the divergence is measured for paddle 3.3, not {paddle.__version__}")
    assert mean == pytest.approx(each.sum() / 4) and torch_mean == pytest.approx(each.sum() / 2, rel=1e-6)


def test_the_causal_loss_convention_is_said_once_and_its_pair_trains_alike():
    def torch_model():
        torch.manual_seed(0)
        return TorchLM()

    spec = PortSpec(torch_model, PaddleLM, _inputs, batches=[(_inputs(), _labels())], torch_loss=_torch_causal_loss,
                    paddle_loss=_paddle_causal_loss,
                    torch_optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3))
    report = verify_port(spec, VerifyOptions(device="cpu", train=True, steps=2))
    said = [n for n in report.train.notes if "ignore_index" in n]
    assert said == ["convention: paddle 3.3.1 divides cross_entropy's summed loss by every label, the ignored ones "
                    "included, under a negative ignore_index (the default -100) and reduction 'mean' (torch: by the "
                    "labels counted): paddle's causal-LM loss here sums and divides by the labels counted"], \
        report.train.notes
    assert report.train.verdict == "pass", report.train.first_bad
    assert render_text(report).count("ignore_index (the default -100) and reduction 'mean'") == 1
