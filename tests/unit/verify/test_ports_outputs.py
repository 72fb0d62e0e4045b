"""A layer returning several outputs of one shape (a rotary embedding's cos and sin tables, as HF's
Llama and Gemma 3 return them): its outputs pair one to one with the other side's, never two of
them with one. With a rotary built from other positions, paired each with its nearest, torch's
sin was compared with paddle's cos."""

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.compare.matching import pair_outputs
from converter.spec import spec_from_functions

B, T, D = 2, 8, 16


class TorchRotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D), persistent=False)

    def forward(self, x, positions):
        freqs = positions[:, :, None].float() * self.inv_freq[None, None]
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos(), emb.sin()


class TorchRotated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.rotary, self.out = torch.nn.Linear(D, D), TorchRotary(), torch.nn.Linear(D, 4)

    def forward(self, x, positions):
        q = self.q(x)
        cos, sin = self.rotary(q, positions)
        half = torch.cat([-q[..., D // 2:], q[..., :D // 2]], -1)
        return self.out(q * cos + half * sin)


class PaddleRotary(paddle.nn.Layer):
    def __init__(self, scale):
        super().__init__()
        self.inv_freq = 1.0 / 10000 ** (paddle.arange(0, D, 2).astype("float32") / D)
        self.scale = scale  # a linear rope scaling torch's side does not apply, where not 1

    def forward(self, x, positions):
        freqs = (positions.astype("float32") * self.scale)[:, :, None] * self.inv_freq[None, None]
        emb = paddle.concat([freqs, freqs], -1)
        return emb.cos(), emb.sin()


class PaddleRotated(paddle.nn.Layer):
    def __init__(self, scale=1.0):
        super().__init__()
        self.q, self.rotary, self.out = paddle.nn.Linear(D, D), PaddleRotary(scale), paddle.nn.Linear(D, 4)

    def forward(self, x, positions):
        q = self.q(x)
        cos, sin = self.rotary(q, positions)
        half = paddle.concat([-q[..., D // 2:], q[..., :D // 2]], -1)
        return self.out(q * cos + half * sin)


def _torch():
    torch.manual_seed(0)
    return TorchRotated().eval()


def _inputs():
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    return x, np.tile(np.arange(T, dtype="int64"), (B, 1))


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("scale", [1.0, 0.5], ids=["clean", "scaled-positions"])
def test_cos_and_sin_pair_with_cos_and_sin(strategy, scale):
    report = verify_port(spec_from_functions(_torch, lambda: PaddleRotated(scale), _inputs),
                         VerifyOptions(strategy=strategy))
    if scale == 1.0:
        assert report.exit_code == 0, report.forward.first_bad
        return
    bad = report.forward.first_bad
    assert report.exit_code == 1 and bad.torch == "rotary", bad
    assert "paired by value" not in bad.note, bad.note
    # the difference measured is cos against cos and sin against sin, from the two layers themselves
    x, positions = _inputs()
    t = [a.numpy() for a in TorchRotary()(torch.from_numpy(x), torch.from_numpy(positions))]
    p = [a.numpy() for a in PaddleRotary(scale)(paddle.to_tensor(x), paddle.to_tensor(positions))]
    paired = max(float(np.abs(a - b).max()) for a, b in zip(t, p))
    assert bad.max_abs == pytest.approx(paired, rel=1e-3), (bad.max_abs, paired)


def test_outputs_pair_one_to_one():
    rng = np.random.default_rng(2)
    cos, sin = (rng.uniform(-1, 1, (1, T, D)).astype(np.float32) for _ in range(2))
    far_cos, far_sin = cos[:, ::-1] * np.float32(0.3), sin[:, ::-1] * np.float32(0.3)  # nearer each other than to theirs
    shapes = [cos.shape, sin.shape]
    pairs = pair_outputs(shapes, shapes, lambda: [cos, sin], lambda: [far_cos, far_sin])
    assert (pairs.torch, pairs.paddle) == ((0, 1), (0, 1))  # none matches: each at its own position
    pairs = pair_outputs(shapes, shapes, lambda: [cos, sin], lambda: [sin + np.float32(1e-7), cos])
    assert (pairs.torch, pairs.paddle) == ((0, 1), (1, 0))  # the same values in another order
    # one paddle output answers for torch outputs that are the same values, not for two others
    pairs = pair_outputs([cos.shape] * 3, shapes, lambda: [cos, sin, cos.copy()], lambda: [cos, far_sin])
    assert (pairs.torch, pairs.paddle) == ((0, 1, 2), (0, 1, 0))
    pairs = pair_outputs(shapes, [cos.shape], lambda: [cos, sin], lambda: [far_sin])
    assert len(pairs) == 1
