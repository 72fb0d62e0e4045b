"""A torch optimizer that subclasses one of torch's (an Adam whose step clips the gradients first,
as many training loops write it): translated as its nearest torch class, with a note saying so, and
the optimizer what-ifs re-run torch's step as that class (they ended in an internal error)."""

import paddle
import pytest
import torch

from helpers.cli import run_verify, spec_path
from converter.errors import UserError
from converter.spec import PortSpec
from converter.train.optimizer import subclass_note, torch_class, translate
from helpers.train import train_check

MAX_NORM = 0.05


class ClippingAdam(torch.optim.Adam):
    """Adam whose step clips the global norm of the gradients first."""

    def __init__(self, params, max_norm=MAX_NORM, **kwargs):
        super().__init__(params, **kwargs)
        self.max_norm = max_norm

    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        return super().step(closure)


class LoggingAdam(ClippingAdam):
    """Two levels below torch's Adam, and nothing of torch's in its name."""


class Plain(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})


def _linear():
    return torch.nn.Linear(3, 2).parameters()


def test_the_nearest_torch_class_is_found_through_any_depth():
    assert torch_class(torch.optim.Adam(_linear())) is torch.optim.Adam
    assert torch_class(LoggingAdam(_linear(), lr=1e-3)) is torch.optim.Adam
    assert torch_class(Plain(_linear())) is torch.optim.Optimizer
    assert subclass_note(torch.optim.AdamW(_linear())) is None
    assert "torch's LoggingAdam is taken as its nearest torch class, torch.optim.Adam" in \
        subclass_note(LoggingAdam(_linear()))


def test_a_subclass_is_translated_as_its_torch_class_and_says_so():
    t = translate(ClippingAdam(_linear(), lr=1e-3, eps=1e-7))
    assert t.optimizer.path == "paddle.optimizer.Adam" and t.optimizer.kwargs["epsilon"] == 1e-7
    assert "torch's ClippingAdam is taken as its nearest torch class, torch.optim.Adam" in t.describe()
    assert "# torch's ClippingAdam is taken as" in t.code()
    built, _ = t.build(paddle.nn.Linear(3, 2))
    assert type(built) is paddle.optimizer.Adam
    plain = translate(torch.optim.Adam(_linear(), lr=1e-3))
    assert "taken as" not in plain.describe() + plain.code()
    with pytest.raises(UserError, match=r"torch optimizer Optimizer \(the nearest torch class of Plain\) has no "
                                        "translation here"):
        translate(Plain(_linear()))


def _mlp(paddle_epsilon):
    spec = PortSpec.from_file(spec_path("train_mlp"))
    spec.module.torch_optimizer = lambda m: ClippingAdam(m.parameters(), lr=3e-3)
    spec.module.paddle_optimizer = lambda m: paddle.optimizer.Adam(
        3e-3, parameters=m.parameters(), epsilon=paddle_epsilon, grad_clip=paddle.nn.ClipGradByGlobalNorm(MAX_NORM))
    return spec


@pytest.mark.slow
def test_a_subclass_with_a_matching_paddle_optimizer_passes_and_a_planted_epsilon_is_named():
    clean = train_check(_mlp(1e-8), steps=4, device="cpu")
    assert clean.first_bad is None, clean.first_bad
    planted = train_check(_mlp(1e-6), steps=4, device="cpu")
    fb = planted.first_bad
    assert fb.phase == "optimizer" and planted.exit_code == 1, fb
    (d,) = planted.diagnosis
    assert "epsilon: torch 1e-08, paddle 1e-06" in d.cause and "reproduces paddle's step" in d.cause, d
    assert "torch's ClippingAdam is taken as its nearest torch class, torch.optim.Adam" in d.cause


@pytest.mark.slow
def test_the_command_ends_in_a_finding_not_an_internal_error(tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text(open(spec_path("train_mlp")).read() + '''

class ClippingAdam(torch.optim.Adam):
    def step(self, closure=None):
        torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], 0.05)
        return super().step(closure)


def torch_optimizer(model):
    return ClippingAdam(model.parameters(), lr=3e-3)


def paddle_optimizer(model):
    return paddle.optimizer.Adam(3e-3, parameters=model.parameters(), epsilon=1e-6,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(0.05))
''')
    r = run_verify("--spec", spec, "--device", "cpu", "--train", "--steps", "3")
    assert r.code == 1, r
    assert "epsilon: torch 1e-08, paddle 1e-06" in r.stdout and "taken as its nearest torch class" in r.stdout, r
