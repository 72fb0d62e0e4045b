import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = os.path.join(ROOT, "tests", "specs")
sys.path.insert(0, ROOT)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from converter.lazy import import_paddle

    import_paddle()


def spec_path(name: str) -> str:
    return os.path.join(SPECS, name + ".py")


class CliResult:
    def __init__(self, code, stdout, stderr):
        self.code, self.stdout, self.stderr = code, stdout, stderr

    def __repr__(self):
        return f"exit {self.code}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def run_convert(*args) -> CliResult:
    from converter.cli import convert_weights
    r = CliRunner().invoke(convert_weights, [str(a) for a in args], catch_exceptions=False)
    return CliResult(r.exit_code, r.stdout, r.stderr)


def run_verify(*args) -> CliResult:
    from converter.verify.command import verify_port
    r = CliRunner().invoke(verify_port, [str(a) for a in args], catch_exceptions=False)
    return CliResult(r.exit_code, r.stdout, r.stderr)


def run_script(*args, timeout=600) -> CliResult:
    """Run an installed console script in a fresh process, as a user would."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return CliResult(p.returncode, p.stdout, p.stderr)


def forward_both(spec, torch_model=None, paddle_model=None):
    """Outputs of both models on the spec's inputs, first tensor of tuple outputs."""
    import paddle
    import torch
    tm = torch_model or spec.torch_model()
    pm = paddle_model or spec.paddle_model()
    tm.eval()
    pm.eval()
    x = spec.inputs()
    with torch.no_grad():
        yt = tm(*[torch.from_numpy(a) for a in x])
    yp = pm(*[paddle.to_tensor(a) for a in x])
    first = lambda y: y[0] if isinstance(y, (tuple, list)) else y
    return first(yt).numpy(), first(yp).numpy()


def assert_fp32_close(a, b):
    """fp32 noise after a few layers: well under 1e-5 of the output's scale."""
    assert a.shape == b.shape
    scale = float(np.abs(a).max()) + 1e-30
    err = float(np.abs(a - b).max())
    assert err <= 2e-6 * scale + 1e-7, f"max abs diff {err:.3e} against output scale {scale:.3e}"


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


def load_output_into(paddle_model, path):
    """Load a converted file the way a user would: paddle.load for .pdparams, safetensors' own
    numpy loader for .safetensors."""
    import paddle
    if str(path).endswith(".pdparams"):
        state = paddle.load(str(path))
    else:
        from safetensors.numpy import load_file
        state = load_file(str(path))
    missing, unexpected = paddle_model.set_state_dict(state)
    assert not missing and not unexpected, (missing, unexpected)
    return paddle_model
