"""A warmup of another length is named as a warmup when the steps checked end before either warmup
does (both rates still rising, peaking at the same step): the rates part while rising from their
start, and each side's linear ramp says where it ends."""

import paddle
import torch

from helpers.cli import spec_path
from helpers.train import train_check
from converter.spec import PortSpec

LR, START = 1e-3, 0.25


def _warmups(torch_steps: int, paddle_steps: int):
    spec = PortSpec.from_file(spec_path("train_mlp"))

    def torch_optimizer(model):
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        return opt, torch.optim.lr_scheduler.LinearLR(opt, start_factor=START, total_iters=torch_steps)

    def paddle_optimizer(model):
        scheduler = paddle.optimizer.lr.LinearWarmup(LR, warmup_steps=paddle_steps, start_lr=START * LR, end_lr=LR)
        return paddle.optimizer.AdamW(scheduler, parameters=model.parameters()), scheduler
    spec.module.torch_optimizer, spec.module.paddle_optimizer = torch_optimizer, paddle_optimizer
    return spec


def test_a_longer_warmup_within_the_steps_checked_is_named_a_warmup():
    report = train_check(_warmups(3, 4), steps=4, device="cpu")
    fb = report.first_bad
    assert fb is not None and fb.phase == "lr" and fb.step == 1, fb
    found = report.diagnosis[0]
    assert found.kind == "warmup", report.diagnosis
    assert "from step 1" in found.cause and "0.001 at step 3" in found.cause and "0.001 at step 4" in found.cause, \
        found.cause


def test_the_same_warmup_passes_the_lr_phase():
    report = train_check(_warmups(3, 3), steps=4, device="cpu")
    assert not [r for r in report.rows if r.phase == "lr" and r.bad]
    assert report.first_bad is None, report.first_bad
