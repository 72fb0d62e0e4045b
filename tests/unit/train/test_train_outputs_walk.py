"""--train walks a model's outputs by one rule on both sides (converter.tree): the floating tensors
inside a namedtuple or a dataclass are the leaves the loss is teacher-forced on, and a float16 or
bfloat16 output is one of them on either side, not dropped on paddle's."""

import pytest

from converter.errors import UserError
from converter.spec import PortSpec
from helpers.train import train_check

STEPS = 2

SPEC = '''
import collections
import dataclasses

import numpy as np
import paddle
import torch

Pair = collections.namedtuple("Pair", "logits hidden")


@dataclasses.dataclass
class Record:
    logits: object
    hidden: object


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        return {torch_out}


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(6, 8)
        self.fc2 = paddle.nn.Linear(8, 3)

    def forward(self, x):
        h = paddle.tanh(self.fc1(x))
        return {paddle_out}


def torch_model():
    torch.manual_seed(0)
    return TorchNet()


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32),)
'''

ONE_OUTPUT = '''

def torch_loss(out, target):
    return (out * out).mean()


def paddle_loss(out, target):
    return (out[0] * out[0]).mean()
'''

FIELDS = '''

def torch_loss(out, target):
    return (out.logits * out.logits).mean() + 0.5 * out.hidden.sum()


def paddle_loss(out, target):
    return (out.logits * out.logits).mean() + {weight} * out.hidden.sum()
'''


def _spec(tmp_path, torch_out, paddle_out, losses=""):
    path = tmp_path / "spec.py"
    path.write_text(SPEC.format(torch_out=torch_out, paddle_out=paddle_out) + losses)
    return PortSpec.from_file(str(path))


def _loss_rows(report) -> dict:
    return {r.torch: r for r in report.rows if r.phase == "loss"}


@pytest.mark.parametrize("container", ["Pair", "Record"])
def test_a_namedtuple_or_dataclass_output_is_teacher_forced_on_both_sides(tmp_path, container):
    """The loss is taken on torch's outputs put inside the model's own container on both sides: a
    clean port passes with a gradient row per output, and a paddle loss that weighs the second
    output otherwise is found at that output's gradient."""
    out = f"{container}(self.fc2(h), h)"
    clean = train_check(_spec(tmp_path, out, out, FIELDS.format(weight="0.5")), steps=STEPS, device="cpu")
    assert clean.verdict == "pass", clean.first_bad
    rows = _loss_rows(clean)
    assert set(rows) == {"loss", "d loss / d output[0]", "d loss / d output[1]"}
    assert all(r.ratio <= 1 for r in rows.values())

    planted = train_check(_spec(tmp_path, out, out, FIELDS.format(weight="0.6")), steps=STEPS, device="cpu")
    assert planted.verdict == "fail" and planted.first_bad.phase == "loss"
    rows = _loss_rows(planted)
    assert rows["d loss / d output[1]"].ratio > 1e3  # the gradient torch's loss gives is 0.5 everywhere, paddle's 0.6
    assert rows["d loss / d output[0]"].ratio <= 1


def test_a_bfloat16_output_is_a_leaf_on_both_sides(tmp_path):
    """A bfloat16 output on both sides is projected by the default loss on both (paddle's is not
    dropped), its gradient row is there and within budget, and the port passes."""
    report = train_check(_spec(tmp_path, "Pair(self.fc2(h), h.to(torch.bfloat16))",
                               "Pair(self.fc2(h), h.astype('bfloat16'))"), steps=STEPS, device="cpu")
    assert report.verdict == "pass", report.first_bad
    rows = _loss_rows(report)
    assert set(rows) == {"loss", "d loss / d output[0]", "d loss / d output[1]"}
    assert all(r.ratio <= 1 for r in rows.values())


def test_paddles_bfloat16_output_takes_torchs_value_in_the_teacher_forced_loss(tmp_path):
    """Paddle's output in bfloat16 where torch's is in float32: the loss phase replaces it with
    torch's value as it replaces paddle's float32 outputs, so both losses and both gradients agree."""
    report = train_check(_spec(tmp_path, "Pair(self.fc2(h), h)", "Pair(self.fc2(h), h.astype('bfloat16'))"),
                         steps=STEPS, device="cpu")
    rows = _loss_rows(report)
    assert set(rows) == {"loss", "d loss / d output[0]", "d loss / d output[1]"}
    assert all(r.ratio <= 1 for r in rows.values())


def test_a_bug_in_paddles_bfloat16_output_reaches_the_gradients(tmp_path):
    """Paddle's bfloat16 output scaled by 1.5: the default loss takes it on paddle's side as on
    torch's, so the model's gradients differ and the port fails in the backward phase."""
    report = train_check(_spec(tmp_path, "Pair(self.fc2(h), h.to(torch.bfloat16))",
                               "Pair(self.fc2(h), (1.5 * h).astype('bfloat16'))"), steps=STEPS, device="cpu")
    assert report.verdict == "fail"
    assert report.first_bad.phase == "backward" and report.first_bad.ratio > 10
    end_to_end = {r.torch: r.ratio for r in report.rows if r.phase == "backward" and r.note.endswith("end-to-end gradient")}
    assert end_to_end["fc1.weight"] > 10 and end_to_end["fc2.weight"] <= 1  # only fc1 feeds the scaled output


def test_paddle_returning_more_floating_outputs_than_torch_is_bad_input(tmp_path):
    """The loss is taken on torch's outputs in place of paddle's: a paddle output torch has none for
    is named, as bad input."""
    spec = _spec(tmp_path, "self.fc2(h)", "(self.fc2(h), h)", ONE_OUTPUT)
    with pytest.raises(UserError, match=r"paddle_model\(\) from .* returns 2 floating-point tensors and torch_model\(\) 1"):
        train_check(spec, steps=STEPS, device="cpu")
