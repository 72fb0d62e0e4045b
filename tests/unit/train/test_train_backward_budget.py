"""The per-layer backward's float64 reference, its cotangents and its budget on small real pairs:
a norm that casts to float32 inside (as HF's RMSNorm does), one whose float64 run still narrows
to float32 (recorded, budgeted from the reference's own change), and an output broadcast along
the batch on torch's side only (HF BERT's position embeddings); each clean, and each with a
planted backward bug that must still be named."""

import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.spec import load_spec
from converter.train.local_runs import Unpaired, cotangent, paddle_grad, unbroadcast
from helpers.train import train_check

COMMON = '''
import numpy as np
import paddle
import torch

B, T, D = 3, 6, 48


def inputs():
    return (np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32) * 3,)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.standard_normal((B, T, D)).astype(np.float32) * 3,), rng.standard_normal((B, T, D)).astype(np.float32))
            for _ in range(2)]


def torch_loss(output, target):
    return ((output - target) ** 2).mean()


def paddle_loss(output, target):
    return ((output - target) ** 2).mean()


def torch_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


class ScaledGrad(paddle.autograd.PyLayer):
    """The identity, its gradient scaled by SCALE: a planted bug when SCALE is not 1."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy * SCALE
'''

NORMS = COMMON + '''

class TorchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(D))

    def forward(self, x):
        if NARROWED:  # float32 inside whatever the input, by a route no cast rule sees
            h = x.new_zeros(x.shape, dtype=torch.float32)
            h.copy_(x)
        else:  # HF's RMSNorm: x.to(torch.float32)
            h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, D)
        self.norm = TorchNorm()

    def forward(self, x):
        return self.norm(self.fc(x))


class PaddleNorm(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.weight = self.create_parameter([D], default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, x):
        if x.dtype == paddle.float64 and not PADDLE_FLOAT64:
            raise TypeError("this port runs in float32 only")
        h = ScaledGrad.apply(x).astype("float32")
        h = h * paddle.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.astype(x.dtype)


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(D, D)
        self.norm = PaddleNorm()

    def forward(self, x):
        return self.norm(self.fc(x))


def torch_model():
    torch.manual_seed(0)
    return TorchNet()


def paddle_model():
    return PaddleNet()
'''

POSITIONS = COMMON + '''
V = 20


def inputs():
    return (np.random.default_rng(0).integers(0, V, (B, T)).astype("int64"),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.integers(0, V, (B, T)).astype("int64"),), rng.standard_normal((B, T, D)).astype(np.float32))
            for _ in range(2)]


class TorchNet(torch.nn.Module):
    """Positions [1, T], broadcast along the batch where they are added (as HF BERT's without
    position_ids)."""

    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(V, D)
        self.positions = torch.nn.Embedding(T, D)
        self.fc = torch.nn.Linear(D, D)

    def forward(self, ids):
        where = torch.arange(ids.shape[1])[None]
        return self.fc(torch.tanh(self.tokens(ids) + self.positions(where)))


class PaddlePositions(paddle.nn.Embedding):
    def forward(self, x):
        return ScaledGrad.apply(super().forward(x))


class PaddleNet(paddle.nn.Layer):
    """Positions [B, T] (as PaddleNLP's BERT builds them)."""

    def __init__(self):
        super().__init__()
        self.tokens = paddle.nn.Embedding(V, D)
        self.positions = PaddlePositions(T, D)
        self.fc = paddle.nn.Linear(D, D)

    def forward(self, ids):
        where = paddle.arange(ids.shape[1]).unsqueeze(0).expand([ids.shape[0], ids.shape[1]])
        return self.fc(paddle.tanh(self.tokens(ids) + self.positions(where)))


def torch_model():
    torch.manual_seed(0)
    return TorchNet()


def paddle_model():
    return PaddleNet()
'''


def _spec(tmp_path, text, **settings_):
    path = tmp_path / "spec.py"
    path.write_text("\n".join(f"{k} = {v!r}" for k, v in settings_.items()) + "\n" + textwrap.dedent(text))
    return load_spec(str(path))


def _backward(report, layer):
    """The rows of the local backward of `layer`."""
    return [r for r in report.rows if r.phase == "backward" and r.note.endswith("local backward of " + layer)
            or r.phase == "backward" and f"local backward of {layer} (" in r.note]


CASES = [(False, True), (True, True), (True, False)]
IDS = ["cast", "narrowed", "narrowed-paddle-float32-only"]


@pytest.mark.parametrize("narrowed, paddle_float64", CASES, ids=IDS)
def test_a_norm_computing_in_float32_inside_is_budgeted_from_a_float64_reference(tmp_path, narrowed, paddle_float64):
    """HF's cast to float32 is kept float64 in the reference; a narrowing no cast rule sees is said,
    and the budget comes from the reference's own change under inputs moved by one unit in the last
    place (the only measure of the fp32 noise left where paddle's layer does not run in float64)."""
    spec = _spec(tmp_path, NORMS, NARROWED=narrowed, PADDLE_FLOAT64=paddle_float64, SCALE=1.0)
    report = train_check(spec, steps=2, device="cpu")
    rows = _backward(report, "norm")
    d_input = [r for r in rows if r.torch == "norm d input[0]"]
    assert d_input and all(r.ratio is not None and r.ratio < 1 for r in rows), \
        [(r.torch, r.ratio, r.note) for r in rows]
    said = "reference narrows to float32 in " in d_input[0].note and "aten.copy_" in d_input[0].note
    assert said == narrowed, d_input[0].note
    assert not [r for r in report.rows if r.phase == "backward" and r.bad]


@pytest.mark.parametrize("narrowed, paddle_float64", CASES, ids=IDS)
def test_a_planted_gradient_scaling_in_the_norm_is_named(tmp_path, narrowed, paddle_float64):
    spec = _spec(tmp_path, NORMS, NARROWED=narrowed, PADDLE_FLOAT64=paddle_float64, SCALE=0.97)
    report = train_check(spec, steps=2, device="cpu")
    fb = report.first_bad
    assert fb is not None and fb.phase == "backward" and fb.torch == "norm d input[0]", fb
    assert any(d.kind == "custom backward" and d.layer == "norm" for d in report.diagnosis), report.diagnosis


def test_an_output_broadcast_on_torchs_side_only_gets_its_gradient_shared_out(tmp_path):
    """Torch's position embedding returns [1, T, D], paddle's [B, T, D]: paddle's cotangent is
    torch's gradient spread over the B copies, and the parameter's gradient is torch's."""
    report = train_check(_spec(tmp_path, POSITIONS, SCALE=1.0), steps=2, device="cpu")
    rows = [r for r in _backward(report, "positions")]
    assert [r.torch for r in rows] == ["positions.weight"], [(r.torch, r.note) for r in rows]
    assert rows[0].ratio < 1 and rows[0].max_abs < 1e-5 and "forward differs" not in rows[0].note
    assert not [r for r in report.rows if r.phase == "backward" and r.bad]


def test_a_planted_gradient_scaling_on_a_broadcast_output_is_named(tmp_path):
    report = train_check(_spec(tmp_path, POSITIONS, SCALE=0.5), steps=2, device="cpu")
    fb = report.first_bad
    assert fb is not None and fb.phase == "backward" and fb.torch == "positions.weight", fb
    assert any(d.kind == "custom backward" and d.layer == "positions" for d in report.diagnosis), report.diagnosis


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(shapes, st.lists(st.booleans(), min_size=4, max_size=4), st.integers(0, 2))
def test_a_spread_cotangent_sums_back_to_torchs_gradient(shape, ones, lead):
    """Where paddle's output is torch's broadcast, the copies' cotangents sum to torch's gradient
    (so the parameters' gradient is torch's); where torch's is paddle's broadcast, paddle's is the
    sum over the copies."""
    small = tuple(1 if one else n for n, one in zip(shape, ones))
    big = tuple([2] * lead) + tuple(shape)
    grad = np.random.default_rng(0).standard_normal(small)
    spread = cotangent(grad, big)
    assert spread.shape == big
    np.testing.assert_allclose(unbroadcast(spread, small), grad, rtol=1e-12, atol=1e-12)
    wide = np.random.default_rng(1).standard_normal(big)
    summed = cotangent(wide, small)
    np.testing.assert_allclose(summed, unbroadcast(wide, small), rtol=1e-12)


def test_a_cotangent_takes_another_shape_of_the_same_elements_and_nothing_else():
    grad = np.arange(24.0).reshape(2, 3, 4)
    assert cotangent(grad, (6, 4)).shape == (6, 4)
    assert cotangent(grad, (2, 3, 4)) is grad
    assert cotangent(grad, (2, 5, 4)) is None
    assert cotangent(grad, (3, 3, 4)) is None


def test_a_gradient_for_an_output_it_does_not_fit_is_never_handed_to_paddle():
    import paddle
    import torch
    out = paddle.zeros([2, 5, 4])
    with pytest.raises(Unpaired, match=r"\[2, 5, 4\] on paddle's side against torch's \[2, 3, 4\]"):
        paddle_grad(torch.ones(2, 3, 4), out, 0)
    shaped = paddle_grad(torch.ones(1, 5, 4), out, 0)
    assert tuple(shaped.shape) == (2, 5, 4) and float(shaped.sum()) == 20.0


def test_exact_zeros_on_both_sides_do_not_dilute_the_budget():
    """An embedding's gradient is exactly 0 on both sides in the rows no token used: the noise of
    the rows computed is judged on those rows alone, the same whether 1 or 31 zero rows surround them."""
    from converter.train.judge import judge
    rng = np.random.default_rng(0)
    used = rng.standard_normal((4, 8)).astype(np.float32)
    e_torch = (rng.standard_normal(used.shape) * 1e-7).astype(np.float32)
    e_paddle = (rng.standard_normal(used.shape) * 3e-7).astype(np.float32)  # paddle's noise, not measured here

    def row(zero_rows):
        pad = np.zeros((zero_rows, 8), np.float32)
        want, got = np.concatenate([used, pad]), np.concatenate([used + e_paddle - e_torch, pad])
        return judge("backward", 0, "w", "w", want, got, np.concatenate([e_torch, pad]))
    few, many = row(1), row(31)
    assert few.ratio == pytest.approx(many.ratio, rel=1e-6) and few.budget == pytest.approx(many.budget, rel=1e-6)
    wrong = judge("backward", 0, "w", "w", np.concatenate([used, np.zeros((31, 8), np.float32)]),
                  np.concatenate([used * 0.99, np.zeros((31, 8), np.float32)]),
                  np.concatenate([e_torch, np.zeros((31, 8), np.float32)]))
    assert wrong.ratio > 10
