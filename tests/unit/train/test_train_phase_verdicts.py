"""Every phase judged on its own teacher-forced inputs, with its own verdict (text and JSON); the
culprit is the earliest phase failing beyond the budget's margin, so a backward row made marginal
does not hide a learning-rate bug, and the teacher-forced optimizer check runs at torch's rate (a
schedule bug is the lr phase's, not the optimizer's)."""

import json

import numpy as np
import paddle
import pytest
import torch

from helpers.cli import spec_path
from converter.spec import PortSpec
from converter.train.report import render_text
from converter.train.result import MARGINAL, PHASES, Row, TrainReport
from converter.train.run import first_bad
from helpers.train import train_check

STEPS = 6
F = paddle.nn.functional
MARGINAL_SCALE = 1e-6  # paddle's GELU gradient times (1 + this): just over the backward budget on train_mlp


def _gelu_slope(x):
    return 0.5 * (1 + paddle.erf(x / np.sqrt(2.0))) + x * paddle.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


class _ScaledGradGelu(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensor()
        return dy * _gelu_slope(x) * (1 + MARGINAL_SCALE)


class _PaddleAct(paddle.nn.Layer):
    def forward(self, x):
        return _ScaledGradGelu.apply(x)


class _TorchAct(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)


def _warmup_of_two(model):
    """train_mlp's schedule with a warmup of 2 steps where torch's has 4."""
    cos = paddle.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=16)
    sched = paddle.optimizer.lr.LinearWarmup(cos, warmup_steps=2, start_lr=3e-4, end_lr=3e-3)
    return paddle.optimizer.AdamW(learning_rate=sched, weight_decay=0.05, parameters=model.parameters()), sched


def _spec(lr_bug: bool):
    """train_mlp with its activation a layer of its own on both sides, paddle's backward of it just
    over budget; with lr_bug, paddle's warmup is 2 steps long."""
    spec = PortSpec.from_file(spec_path("train_mlp"))
    module = spec.module

    def act_forward(self, x):
        return self.fc2(self.drop(self.act(self.norm(self.fc1(x)))))

    class TorchMLP(module.TorchMLP):
        def __init__(self):
            super().__init__()
            self.act = _TorchAct()
        forward = act_forward

    class PaddleMLP(module.PaddleMLP):
        def __init__(self):
            super().__init__()
            self.act = _PaddleAct()
        forward = act_forward

    def torch_model():
        torch.manual_seed(0)
        return TorchMLP()
    module.torch_model, module.paddle_model = torch_model, PaddleMLP
    if lr_bug:
        module.paddle_optimizer = _warmup_of_two
    return spec


def _verdicts(report) -> dict:
    return {p["phase"]: p["verdict"] for p in report.to_json()["phases"]}


@pytest.mark.slow
def test_an_lr_bug_is_named_as_an_lr_bug_beside_a_marginal_backward_row():
    report = train_check(_spec(lr_bug=True), steps=STEPS, device="cpu")
    backward = report.phase("backward")
    assert 1 < backward.worst.ratio <= MARGINAL, backward.worst  # the premise: a marginal backward row
    fb = report.first_bad
    assert fb is not None and fb.phase == "lr", fb
    assert [d.kind for d in report.diagnosis] == ["warmup"], report.diagnosis
    # each phase's own verdict: the optimizer, teacher-forced at torch's rate, passes
    verdicts = _verdicts(report)
    assert verdicts == {"structure": "pass", "loss": "pass", "backward": "marginal", "lr": "fail",
                        "optimizer": "pass", "steps": verdicts["steps"]}, verdicts
    assert report.phase("optimizer").rows and all(r.ratio <= 1 for r in report.phase("optimizer").rows)
    text = render_text(report)
    lines = {line.split("  ")[1].strip(): line for line in text.splitlines()
             if line.startswith("  ") and line.split("  ")[1].strip() in ("backward", "learning rate")}
    assert "marginal" in lines["backward"] and " fail " in lines["learning rate"], text
    assert ">> first over budget: learning rate" in text
    back = TrainReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back.first_bad.phase == "lr" and _verdicts(back) == verdicts


@pytest.mark.slow
def test_a_marginal_backward_row_alone_is_still_named_and_fails_the_report():
    report = train_check(_spec(lr_bug=False), steps=STEPS, device="cpu")
    assert _verdicts(report)["backward"] == "marginal"
    assert report.first_bad is not None and report.first_bad.phase == "backward", report.first_bad
    assert report.verdict == "fail" and report.exit_code == 1


def _row(phase, ratio, name="w"):
    return Row(phase, 0, name, name, ratio, 0.0, 1.0)


@pytest.mark.parametrize("rows, named", [
    ([_row("backward", 1.5), _row("lr", 1e3), _row("steps", 50.0)], ("lr", 1e3)),
    ([_row("backward", 1.5), _row("optimizer", 1.2)], ("backward", 1.5)),
    ([_row("loss", 1.9), _row("backward", float("nan"))], ("backward", None)),
    ([_row("structure", float("inf")), _row("lr", 1e3)], ("structure", float("inf"))),
    ([_row("loss", 0.5), _row("optimizer", 2.5), _row("steps", 1e4)], ("optimizer", 2.5)),
    ([_row("lr", 0.2), _row("steps", MARGINAL)], ("steps", MARGINAL)),
    ([_row("lr", 0.2)], None),
])
def test_the_culprit_is_the_earliest_phase_failing_beyond_the_margin(rows, named):
    found = first_bad(rows)
    if named is None:
        assert found is None
        return
    assert found is not None and found.phase == named[0]
    assert found.ratio == named[1] or (named[1] is None and np.isnan(found.ratio))
    report = TrainReport(rows, [], found)
    verdicts = {p.phase: p.label for p in report.phases}
    assert set(verdicts) == set(PHASES) and verdicts[found.phase] in ("fail", "marginal")
    unchecked = [p for p in PHASES if not any(r.phase == p for r in rows)]
    # the structure phase lists what it finds: nothing found is a pass; the others compare, none is not compared
    assert all(verdicts[p] == ("pass" if p == "structure" else "not compared") for p in unchecked), verdicts
