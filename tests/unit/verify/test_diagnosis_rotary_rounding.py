"""A rotary table's rounding budget, measured on a layer with two outputs (cos and sin) that torch
returns for one row of positions and paddle for every row of the batch: the table's rounding
effect is each output's rounded run set against its own float64 values, laid out as they are
compared. A table whose low frequencies differ (YaRN's factor taken otherwise) is then not
diagnosed as the layer rounding its own inputs, and a table whose inverse frequencies really are
rounded to TF32's mantissa still is."""

import numpy as np
import paddle
import torch

from converter.compare.precision import round_array
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

B, T, D = 2, 12, 8
INV_FREQ = 10000.0 ** (-np.arange(0, D, 2) / D)  # 1, 0.1, 0.01, 0.001


class Rotary(torch.nn.Module):
    """cos and sin of positions times the inverse frequencies, for one row: [1, T, D] each."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor(INV_FREQ, dtype=torch.float32), persistent=False)

    def forward(self, x):
        positions = torch.arange(x.shape[1], dtype=self.inv_freq.dtype)[None, :, None]
        freqs = (positions @ self.inv_freq[None, None, :]).squeeze(0)[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.rotary = Rotary()

    def forward(self, x):
        cos, sin = self.rotary(x)
        h = self.proj(x)
        return h * cos + torch.flip(h, dims=[-1]) * sin


class PaddleRotary(paddle.nn.Layer):
    """The same table for every row of the batch ([B, T, D] each), from `inv_freq`."""

    def __init__(self, inv_freq):
        super().__init__()
        self.inv_freq = paddle.to_tensor(np.asarray(inv_freq, dtype="float32"))

    def forward(self, x):
        positions = paddle.arange(x.shape[1], dtype="float32").reshape([1, -1, 1])
        freqs = paddle.matmul(positions, self.inv_freq.reshape([1, 1, -1])).expand([x.shape[0], -1, -1])
        emb = paddle.concat([freqs, freqs], axis=-1)
        return emb.cos(), emb.sin()


class PaddleNet(paddle.nn.Layer):
    def __init__(self, inv_freq):
        super().__init__()
        self.proj = paddle.nn.Linear(D, D)
        self.rotary = PaddleRotary(inv_freq)

    def forward(self, x):
        cos, sin = self.rotary(x)
        h = self.proj(x)
        return h * cos + paddle.flip(h, axis=[-1]) * sin


RULES = {"name": "rotary", "unmatched": "keep", "rules": [{"kind": "transpose", "match": r"proj\.weight"}]}


def _torch():
    torch.manual_seed(0)
    return TorchNet().eval()


def _inputs():
    return (np.random.default_rng(0).standard_normal((B, T, D)).astype("float32"),)


def _verify(inv_freq):
    spec = spec_from_functions(_torch, lambda: PaddleNet(inv_freq), _inputs, mapping=RULES)
    return verify(spec, Options(device="cpu"), bisect=True)


def _rounding(report) -> list:
    return [d for d in report.diagnosis if "TF32" in d.cause or d.kind in ("own rounding", "tf32")]


def test_a_table_whose_low_frequencies_differ_is_not_diagnosed_as_rounding():
    interpolated = INV_FREQ.copy()
    interpolated[-1] /= 40.0  # the lowest frequency interpolated by a YaRN factor the other side does not use
    interpolated[-2] /= 1.5  # and the next partly
    report = _verify(interpolated)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "rotary", report.first_bad
    assert not _rounding(report), report.diagnosis


def test_a_table_whose_inverse_frequencies_are_rounded_to_tf32_is_diagnosed_as_its_own_rounding():
    report = _verify(round_array(INV_FREQ.astype("float32"), "tf32"))
    assert report.verdict == "fail"
    assert report.first_bad.torch == "rotary", report.first_bad
    assert [d.kind for d in _rounding(report)] == ["own rounding"], report.diagnosis


def test_the_table_pair_is_compared_after_broadcasting():
    report = _verify(INV_FREQ)
    assert report.verdict == "pass", report.first_bad
    rotary = next(r for r in report.layers if r.torch == "rotary")
    assert "broadcasting" in rotary.note and rotary.ratio is not None and rotary.ratio < 1, rotary
