"""Causes found by re-running the first layer over budget with one argument of a functional call its
forward makes changed (verify/counterfactual_calls.py): the call, its argument and the layer that
makes it are named, confirmed by re-running; arguments are read from the function's signature."""

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
import torch
import torch.nn.functional as TF

from converter import VerifyOptions, verify_port
from converter.spec import spec_from_functions
from converter.verify.counterfactual_calls import RecordedCall, _literals, candidates


def torch_block(h, kind):
    if kind == "gelu":
        return TF.gelu(h)
    if kind == "softmax":
        return TF.softmax(h, dim=1)
    return TF.interpolate(h.reshape(2, 2, 4, 4), scale_factor=2, mode="bilinear", align_corners=True)


def paddle_block(h, kind):
    if kind == "gelu":
        return F.gelu(h, approximate=True)
    if kind == "softmax":
        return F.softmax(h, axis=-1)
    return F.interpolate(h.reshape([2, 2, 4, 4]), scale_factor=2, mode="bilinear")


class TorchBlock(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.fc, self.kind = torch.nn.Linear(8, 8), kind

    def forward(self, x):
        return torch_block(self.fc(x), self.kind)


class PaddleBlock(paddle.nn.Layer):
    """The port's block: the functional call is written in its code, not kept as a setting."""

    def __init__(self, kind):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)
        self._kind = kind

    def forward(self, x):
        return paddle_block(self.fc(x), self._kind)


class TorchNet(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.inp, self.block = torch.nn.Linear(8, 8), TorchBlock(kind)

    def forward(self, x):
        return self.block(self.inp(x)).sum(-1)


class PaddleNet(paddle.nn.Layer):
    def __init__(self, kind):
        super().__init__()
        self.inp, self.block = paddle.nn.Linear(8, 8), PaddleBlock(kind)

    def forward(self, x):
        return self.block(self.inp(x)).sum(-1)


CASES = {
    "gelu": ("calls paddle.nn.functional.gelu(..., approximate=True); re-run on torch's recorded inputs with "
             "approximate=False", "pass approximate=False to gelu in block's forward"),
    "softmax": ("calls paddle.nn.functional.softmax(..., axis=-1); re-run on torch's recorded inputs with axis=-2",
                "pass axis=-2 to softmax in block's forward"),
    "interpolate": ("calls paddle.nn.functional.interpolate(..., align_corners=False); re-run on torch's recorded "
                    "inputs with align_corners=True", "pass align_corners=True to interpolate in block's forward"),
}


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("kind", list(CASES))
def test_a_functional_call_s_argument_is_confirmed_by_re_running(kind, strategy):
    x = np.random.RandomState(0).randn(4, 8, 8).astype("float32")
    if kind == "interpolate":
        x = x[:2, :4]

    def torch_model():
        torch.manual_seed(0)
        return TorchNet(kind).eval()
    report = verify_port(spec_from_functions(torch_model, lambda: PaddleNet(kind), lambda: (x,)),
                         VerifyOptions(strategy=strategy, bisect=True))
    forward = report.forward
    assert report.exit_code == 1 and forward.first_bad.torch == "block", forward.first_bad
    cause, hint = CASES[kind]
    found = [d for d in forward.diagnosis if d.kind == "call argument"]
    assert found and cause in found[0].cause and "confirmed by re-running" in found[0].cause, forward.diagnosis
    assert found[0].hint == hint
    # the cause was printed only because it is one: the port, so changed, passes
    assert not [d for d in forward.diagnosis if d.kind in ("tf32", "bf16", "fp16", "own rounding")]


def test_words_come_from_the_annotation_and_the_aliases_it_names():
    assert _literals("paddle.nn.functional.interpolate", "mode") == ("linear", "area", "nearest", "bilinear",
                                                                       "bicubic", "trilinear")
    assert set(_literals("paddle.nn.functional.max_pool2d", "data_format")) == {"NCHW", "NHWC"}


def test_candidates_of_a_recorded_call():
    call = RecordedCall("paddle.nn.functional.softmax", 0, "block", {"axis": -1, "dtype": None, "name": None}, 3)
    assert candidates(call, "axis") == [-3, -2]  # the other axes of its input, counted from the end as it counts
    assert candidates(call, "dtype") == []
    interp = RecordedCall("paddle.nn.functional.interpolate", 0, "", {"mode": "nearest", "align_corners": False}, 4)
    assert candidates(interp, "align_corners") == [True]
    assert "bilinear" in candidates(interp, "mode") and "nearest" not in candidates(interp, "mode")
