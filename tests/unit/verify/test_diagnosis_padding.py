"""Paddle's Embedding(padding_idx=p) returns zeros for id p, where torch's returns its stored row:
with a row that is not zero, the difference is named with its cause."""

import numpy as np
import paddle
import torch

from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

VOCAB, DIM, PAD = 32, 16, 0


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.proj = torch.nn.Linear(DIM, DIM)

    def forward(self, ids):
        return self.proj(self.embed(ids))


class PaddleNet(paddle.nn.Layer):
    def __init__(self, padding_idx=PAD):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, DIM, padding_idx=padding_idx)
        self.proj = paddle.nn.Linear(DIM, DIM)

    def forward(self, ids):
        return self.proj(self.embed(ids))


def torch_model(pad_row=1.0):
    torch.manual_seed(0)
    model = TorchNet()
    with torch.no_grad():
        model.embed.weight[PAD] = pad_row  # a trained checkpoint's pad row need not be zero
    return model.eval()


def inputs():
    ids = np.random.default_rng(0).integers(1, VOCAB, (2, 8)).astype("int64")
    ids[:, -2:] = PAD
    return (ids,)


def _verify(torch_fn, paddle_fn):
    return verify(spec_from_functions(torch_fn, paddle_fn, inputs, label="padding"), Options(device="cpu"), bisect=True)


def test_a_stored_pad_row_that_paddle_zeros_is_named_with_its_cause():
    report = _verify(torch_model, PaddleNet)
    assert report.verdict == "fail" and report.first_bad.torch == "embed", report.to_json()["first_bad_layer"]
    causes = " ".join(d.cause for d in report.diagnosis)
    assert "padding_idx=0 and returns zeros" in causes, causes


def test_a_zero_pad_row_or_no_padding_idx_passes():
    assert _verify(lambda: torch_model(0.0), PaddleNet).verdict == "pass"
    assert _verify(torch_model, lambda: PaddleNet(padding_idx=None)).verdict == "pass"


def test_an_hf_keep_mask_and_an_additive_mask_of_the_same_positions_are_the_same_mask():
    """HF's 2-D attention_mask (1 keeps, 0 masks; integers or floats) against PaddleNLP's additive
    [B, 1, 1, T] mask: the same positions masked is no mask finding; other positions are."""
    from converter.verify.diagnose_model import _same_as_keep_mask
    keep = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype="int64")
    additive = np.where(keep == 0, -1e4, 0.0).astype("float32")[:, None, None, :]
    masked = additive <= -1e3
    assert _same_as_keep_mask(masked, keep) and _same_as_keep_mask(masked, keep.astype("float32"))
    other = masked.copy()
    other[0, 0, 0, 0] = True
    assert not _same_as_keep_mask(other, keep)
    assert not _same_as_keep_mask(masked, np.array([[1, 2, 1, 0], [1, 1, 0, 0]]))  # ids, not a mask
