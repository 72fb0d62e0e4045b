"""A gradient scaled by a constant in paddle's backward is named as a custom backward with its
factor; a zero one as a stopped gradient. The plant wraps a layer's forward as a user patches a
model (the bound forward of the layer built, captured in a closure), so in the copies the checks
train the wrapped layer's own parameters get no gradient: the culprit's own gradient decides."""

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.cli import spec_path
from helpers.train import train_check
from converter.spec import PortSpec
from converter.train.judge import scale_of

STEPS = 2


def _scaled_into_fc2(factor: float):
    """train_mlp with paddle's fc2 taking its input through an identity whose backward multiplies by `factor`."""
    spec = PortSpec.from_file(spec_path("train_mlp"))
    build = spec.module.paddle_model

    class Scaled(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, dy):
            return dy * factor

    def paddle_model():
        model = build()
        forward = model.fc2.forward
        model.fc2.forward = lambda x: forward(Scaled.apply(x))
        return model
    spec.module.paddle_model = paddle_model
    return spec


@pytest.mark.parametrize("factor, kind, words", [(0.5, "custom backward", ["times 0.5", "scales the gradient"]),
                                                 (-1.0, "custom backward", ["times -1"]),
                                                 (0.0, "stopped gradient", ["stopped on paddle's side"])])
def test_a_scaled_gradient_is_a_custom_backward_and_a_zero_one_is_stopped(factor, kind, words):
    report = train_check(_scaled_into_fc2(factor), steps=STEPS, device="cpu")
    fb = report.first_bad
    assert fb is not None and fb.phase == "backward" and fb.torch == "fc2 d input[0]", fb
    found = report.diagnosis[0]
    assert found.kind == kind and found.layer == "fc2", report.diagnosis
    for w in words:
        assert w in found.cause, (w, found.cause)
    assert report.exit_code == 1


@settings(max_examples=50, deadline=None)
@given(st.floats(-4, 4).filter(lambda k: abs(k - 1) > 0.01 and abs(k) > 0.01), st.integers(0, 2 ** 31 - 1))
def test_the_factor_is_found_where_it_fits_and_not_where_it_does_not(k, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, 7)).astype(np.float32)
    assert scale_of(a, k * a) == pytest.approx(k, rel=1e-5)
    assert scale_of(a, a) is None
    assert scale_of(a, k * a + 0.1 * abs(k) * rng.standard_normal(a.shape)) is None
    assert scale_of(a, np.zeros_like(a)) is None
