"""verify-port on inputs and models that a careless or hostile spec gives: each is exit 2 with
one line, or an honest verdict, never a traceback and never a pass it has not earned."""

import numpy as np
import pytest

from conftest import run_verify

SPEC = '''
import numpy as np
import paddle
import torch

SCALE = {scale}


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return {torch_out}


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(8, 8)
        self.b = paddle.nn.Linear(8, 8)

    def forward(self, x):
        y = self.b(paddle.nn.functional.relu(self.a(x)) * {bug})
        return {paddle_out}


def torch_model():
    torch.manual_seed(0)
    return TorchNet(){torch_cast}


def paddle_model():
    return PaddleNet()


def inputs():
    return ({inputs},)
'''

NORMAL = "np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * np.float32(SCALE)"


def write_spec(tmp_path, name="spec.py", scale="1.0", torch_out="y", paddle_out="y", bug="1.0", torch_cast="",
               inputs=NORMAL, extra=""):
    path = tmp_path / name
    path.write_text(SPEC.format(scale=scale, torch_out=torch_out, paddle_out=paddle_out, bug=bug,
                                torch_cast=torch_cast, inputs=inputs) + extra)
    return path


def one_line(r, code):
    """The run ended with `code` and (for a bad input) one line on stderr, no traceback."""
    assert r.code == code, r
    assert "Traceback" not in r.stderr + r.stdout, r
    if code == 2:
        assert len(r.stderr.strip().splitlines()) == 1, r
        assert r.stderr.startswith("error: "), r
        assert r.stdout == "", r  # no partial report
    return r.stderr


# budgets that overflow float32 -------------------------------------------------------------

def test_budget_of_values_whose_squares_overflow_float32_stays_finite():
    from converter.verify.budget import make_budget
    rng = np.random.default_rng(0)
    y64 = rng.standard_normal(256) * 2.5e19  # squares above float32's 3.4e38
    y32 = y64.astype(np.float32)
    budget = make_budget({"torch": "fp32", "paddle": "fp32"}, y32, y64, None, {})
    assert np.isfinite(budget.var).all()
    clean, _ = budget.ratio(np.abs(y32.astype(np.float64) - y64))
    planted, _ = budget.ratio(np.abs(y32 * np.float32(1.5) - y32))
    assert clean < 1 < planted, (clean, planted)


def test_small_values_keep_a_float32_budget():
    from converter.verify.budget import make_budget
    y64 = np.random.default_rng(1).standard_normal(64)
    budget = make_budget({"torch": "fp32", "paddle": "fp32"}, y64.astype(np.float32), y64, None, {})
    assert budget.var.dtype == np.float32


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_activations_of_1e30_pass_a_clean_port_and_fail_a_planted_scale(tmp_path, strategy):
    clean = write_spec(tmp_path, "clean.py", scale="1e30")
    r = run_verify("--spec", clean, "--device", "cpu", "--strategy", strategy)
    assert r.code == 0 and "PASS" in r.stdout, r
    planted = write_spec(tmp_path, "planted.py", scale="1e30", bug="1.5")
    r = run_verify("--spec", planted, "--device", "cpu", "--strategy", strategy)
    assert r.code == 1 and "FAIL" in r.stdout, r
