"""A model whose forward is set on the instance (`model.forward = lambda x: forward(x) * 2`, a spec's
way to change what a model returns): the float64 copies run the copy's own layers, not the original's
float32 ones, so the float64 reference is made and paddle's own error is measured."""

import numpy as np
import paddle
import pytest
import torch

from converter import VerifyOptions, verify_port
from converter.spec import spec_from_functions
from converter.tree import model_copy


def _doubled(model):
    forward = model.forward
    model.forward = lambda x: forward(x) * 2
    return model


def torch_model():
    torch.manual_seed(0)
    return _doubled(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).eval())


def paddle_model():
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Tanh(), paddle.nn.Linear(8, 4))
    return _doubled(net)


def inputs():
    return (np.random.default_rng(0).standard_normal((3, 8)).astype("float32"),)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_forward_set_on_the_instance_is_verified(strategy):
    report = verify_port(spec_from_functions(torch_model, paddle_model, inputs), VerifyOptions(strategy=strategy))
    assert report.exit_code == 0 and str(report.verdict) == "pass"


def test_the_copy_runs_its_own_layers():
    model = torch_model()
    copied = model_copy(model).double()
    x = torch.from_numpy(inputs()[0])
    assert copied(x.double()).dtype == torch.float64  # the original's float32 layers would refuse float64 inputs
    torch.testing.assert_close(copied(x.double()).float(), model(x), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        copied[0].weight.zero_()
    assert not torch.equal(copied(x.double()).float(), model(x))  # the copy's weights, not the original's
