"""The precision diagnosis is for rounding noise only: a layer whose weight is off by a small
factor has a difference that follows its output, which no lower precision makes."""

import pytest
import sys

import paddle

from helpers.cli import SPECS
from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

sys.path.insert(0, SPECS)
import seed_report as s  # noqa: E402


class ScaledLinear(paddle.nn.Linear):
    """A Linear whose weight is used 0.05% too large: as large as fp16's rounding, but not noise."""

    def forward(self, x):
        return paddle.matmul(x, self.weight * 1.0005) + self.bias


@pytest.mark.slow


def test_a_slightly_scaled_weight_is_not_called_a_precision_effect():
    report = verify(spec_from_functions(s.torch_model, lambda: s.PaddleBlock(ScaledLinear), s.inputs),
                    Options(device="cpu"), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "query_proj", report.to_json()["first_bad_layer"]
    causes = " ".join(d.cause for d in report.diagnosis)
    assert "consistent with" not in causes and "mantissa" not in causes, causes


@pytest.mark.slow


def test_silent_tf32_rounding_is_still_called_so():
    report = verify(spec_from_functions(s.torch_model, s.paddle_model_silent_tf32, s.inputs), Options(device="cpu"),
                    bisect=True)
    assert "TF32" in " ".join(d.cause for d in report.diagnosis)
