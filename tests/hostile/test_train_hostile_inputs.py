"""verify-port --train on specs whose training parts misbehave: each is exit 2 with one line
naming what is wrong, never a traceback or an internal error."""

import pytest

from helpers.cli import run_verify, spec_path

SPEC = '''
import asyncio

import numpy as np
import paddle
import torch


class Halt(BaseException):
    pass


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        {torch_forward}
        return self.fc(x)


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


def torch_model():
    torch.manual_seed(0)
    return TorchNet()


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32),)
'''


def run_train(tmp_path, extra="", torch_forward="pass"):
    path = tmp_path / "spec.py"
    path.write_text(SPEC.format(torch_forward=torch_forward) + extra)
    r = run_verify("--spec", path, "--device", "cpu", "--train", "--steps", "2")
    assert r.code == 2, r
    assert "Traceback" not in r.stderr + r.stdout and r.stdout == "", r
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r
    return r.stderr


@pytest.mark.parametrize("params", [
    "list(model.parameters()) + [torch.nn.Parameter(torch.zeros(3))]",
    "[{'params': list(model.parameters())}, {'params': [torch.zeros(3, requires_grad=True)]}]",
])
def test_a_torch_optimizer_holding_a_tensor_not_the_models_is_named(tmp_path, params):
    err = run_train(tmp_path, f"\n\ndef torch_optimizer(model):\n    return torch.optim.SGD({params}, lr=0.1)\n")
    assert "torch_optimizer(model) holds a tensor that is not one of the model's parameters" in err, err
    assert "item 2 of those it holds, shape [3]" in err, err


def test_a_paddle_optimizer_holding_a_tensor_not_the_models_is_named(tmp_path):
    extra = ("\n\ndef torch_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "\n\ndef paddle_optimizer(model):\n"
             "    stray = paddle.create_parameter([3], 'float32')\n"
             "    return paddle.optimizer.SGD(0.1, parameters=list(model.parameters()) + [stray])\n")
    err = run_train(tmp_path, extra)
    assert "paddle_optimizer(model) holds a tensor that is not one of the model's parameters" in err, err


@pytest.mark.parametrize("batch,words", [
    ("np.array([[object()] * 4] * 2)", "is an array of object"),
    ("np.zeros((0, 4), np.float32)", "has shape [0, 4]: an empty batch"),
    ("np.full((2, 4), np.inf, np.float32)", "holds inf at [0, 0]"),
])
def test_bad_batches_are_named(tmp_path, batch, words):
    err = run_train(tmp_path, f"\n\ndef batches():\n    return [(({batch},), None)]\n")
    assert "batches()[0] inputs[0]" in err and words in err, err


def test_a_target_of_objects_is_named(tmp_path):
    extra = ("\n\ndef batches():\n    return [((inputs()[0],), np.array([object()] * 2))]\n"
             "\n\ndef torch_loss(out, target):\n    return out.sum()\n"
             "\n\ndef paddle_loss(out, target):\n    return out.sum()\n")
    err = run_train(tmp_path, extra)
    assert "batches()[0] target is an array of object" in err, err


@pytest.mark.parametrize("raised", ["asyncio.CancelledError('stop')", "Halt('stop')"])
@pytest.mark.parametrize("part", ["batches", "torch_optimizer", "paddle_optimizer", "torch_loss", "paddle_loss",
                                  "forward"])
def test_base_exceptions_from_training_parts_are_one_line(tmp_path, raised, part):
    name = raised.split("(")[0].split(".")[-1]
    partners = {"paddle_optimizer": "torch_optimizer", "torch_loss": "paddle_loss", "paddle_loss": "torch_loss"}
    works = {"torch_optimizer": "return torch.optim.SGD(model.parameters(), lr=0.01)",
             "paddle_loss": "return model.sum()", "torch_loss": "return model.sum()"}
    if part == "forward":
        err = run_train(tmp_path, torch_forward=f"if self.training:\n            raise {raised}")
    else:
        extra = f"\n\ndef {part}(*args):\n    raise {raised}\n"
        if part in partners:  # the part's partner, which works: a spec gives both or neither
            extra += f"\n\ndef {partners[part]}(model, *args):\n    {works[partners[part]]}\n"
        err = run_train(tmp_path, extra)
    assert f"{name}: stop (line " in err, err


def test_steps_beyond_what_a_check_needs_are_one_line():
    """A step count with no bound ran until killed: --steps takes 1 to MAX_STEPS."""
    from converter.api import MAX_STEPS
    for steps in ("0", str(MAX_STEPS + 1), "99999999999999999999"):
        r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--train", "--steps", steps)
        assert r.code == 2 and r.stderr.count("\n") == 1 and "--steps" in r.stderr, (steps, r)
