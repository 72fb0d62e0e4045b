"""The float64 reference must really be float64. HF's RMSNorm (LlamaRMSNorm and its copies) casts
its input to float32 and back: run in float64 as it is, its "float64" output is its float32 one, so
torch's own fp32 error reads exactly 0 and the budget collapses to the output's rounding. Casts of
float64 tensors to a lower precision are kept in float64 in every reference run."""

import pytest
import numpy as np
import paddle
import torch

from converter.spec import spec_from_functions
from converter.compare.replay import float64_reference
from converter.verify.run import verify
from converter.compare.session import Options

HIDDEN = 1536


class CastingRMSNorm(torch.nn.Module):
    """As HF writes it: the statistics in float32 whatever the input's dtype."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(HIDDEN))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon)).to(dtype)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.norm = CastingRMSNorm()

    def forward(self, x):
        return self.norm(self.proj(x))


class PaddleRMSNorm(paddle.nn.Layer):
    """As PaddleNLP writes it: float32 statistics too, from its own mean kernel."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = self.create_parameter([HIDDEN], default_initializer=paddle.nn.initializer.Constant(1.0))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.astype("float32")
        variance = x.pow(2).mean(-1, keepdim=True)
        return (x * paddle.rsqrt(variance + self.variance_epsilon)).astype(dtype) * self.weight


class PaddleNet(paddle.nn.Layer):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.proj = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.norm = PaddleRMSNorm(eps)

    def forward(self, x):
        return self.norm(self.proj(x))


def torch_model():
    torch.manual_seed(0)
    model = TorchNet()
    with torch.no_grad():
        model.proj.weight.normal_(0, HIDDEN ** -0.5)
        model.norm.weight.normal_(1.0, 0.1)
    return model.eval()


def inputs():
    return (np.random.default_rng(0).standard_normal((4, 32, HIDDEN)).astype("float32"),)


def test_a_cast_inside_stays_float64_in_a_reference_run():
    norm = CastingRMSNorm().double()
    x = torch.randn(8, HIDDEN, dtype=torch.float64)
    with torch.no_grad():
        as_written = norm(x)
        with float64_reference():
            kept = norm(x)
    exact = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    assert kept.dtype == torch.float64
    assert float((kept - exact).abs().max()) < 1e-12 < float((as_written - exact).abs().max())


@pytest.mark.slow


def test_a_clean_port_of_a_casting_rmsnorm_passes_with_an_honest_budget():
    spec = spec_from_functions(torch_model, PaddleNet, inputs, label="casting RMSNorm")
    report = verify(spec, Options(device="cpu", strategy="full"), bisect=True)
    norm = next(r for r in report.layers if r.torch == "norm")
    assert report.verdict == "pass", report.to_json()["first_bad_layer"]
    assert norm.ratio < 0.6, norm.ratio


@pytest.mark.slow


def test_a_wrong_epsilon_in_it_is_named():
    spec = spec_from_functions(torch_model, lambda: PaddleNet(eps=1e-4), inputs, label="casting RMSNorm, epsilon")
    report = verify(spec, Options(device="cpu", strategy="full"), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "norm", report.to_json()["first_bad_layer"]


def test_the_float64_copy_widens_each_tensor_keeps_ties_and_leaves_the_model_alone():
    from converter.frameworks.torch_side import float64_copy

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("steps", torch.tensor(3))
            self.register_buffer("scale", torch.full((4,), 0.5))

    torch.manual_seed(0)
    model = Tied()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wide = float64_copy(model)
    assert wide.head.weight is wide.embed.weight and isinstance(wide.head.weight, torch.nn.Parameter)
    assert wide.embed.weight.dtype == torch.float64 and wide.scale.dtype == torch.float64
    assert wide.steps.dtype == torch.int64 and int(wide.steps) == 3
    assert torch.equal(wide.embed.weight, model.embed.weight.double())
    for key, value in model.state_dict().items():
        assert value.dtype == before[key].dtype and torch.equal(value, before[key]), key
    assert wide.embed.weight.data_ptr() != model.embed.weight.data_ptr()
