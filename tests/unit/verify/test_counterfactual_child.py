"""A culprit whose row is worst at an input its own code computed for a child (an activation
between two Linear layers, its effect on the block's output shrunk by a small residual branch and
a norm): its causes are searched judged at that input, and named so; the clean twin passes."""

import numpy as np
import paddle
import pytest
import torch

from converter import VerifyOptions, verify_port
from converter.spec import spec_from_functions

D = 16


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D), torch.nn.LayerNorm(D)

    def forward(self, x):  # HF's gelu_new: the tanh approximation
        return self.norm(x + 1e-3 * self.fc2(torch.nn.functional.gelu(self.fc1(x), approximate="tanh")))


class PaddleBlock(paddle.nn.Layer):
    """The activation held as an attribute, as PaddleNLP's encoder layer holds it."""

    def __init__(self, approximate):
        super().__init__()
        self.fc1, self.fc2, self.norm = paddle.nn.Linear(D, 4 * D), paddle.nn.Linear(4 * D, D), paddle.nn.LayerNorm(D)
        self.activation = paddle.nn.functional.gelu
        self.approximate_kw = {"approximate": True} if approximate else {}

    def forward(self, x):
        return self.norm(x + 1e-3 * self.fc2(self.activation(self.fc1(x), **self.approximate_kw)))


def _spec(approximate):
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(TorchBlock(), torch.nn.Linear(D, 2)).eval()

    def paddle_model():
        return paddle.nn.Sequential(PaddleBlock(approximate), paddle.nn.Linear(D, 2))
    x = (np.random.RandomState(0).randn(4, 8, D) * 3).astype("float32")
    return spec_from_functions(torch_model, paddle_model, lambda: (x,))


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_cause_at_a_child_s_input_is_found_judged_there(strategy):
    report = verify_port(_spec(approximate=False), VerifyOptions(strategy=strategy, bisect=True))
    bad = report.forward.first_bad
    assert report.exit_code == 1 and bad.torch == "0" and bad.worst_input == "0.fc2", bad
    [found] = [d for d in report.forward.diagnosis if "confirmed by re-running" in d.cause]
    assert ("calls paddle.nn.functional.gelu(..., approximate=False) through its attribute activation; re-run on "
            "torch's recorded inputs with approximate=True it gives torch's input of 0.fc2 within the budget") \
        in found.cause, found.cause
    assert found.hint == "pass approximate=True where 0's forward calls self.activation (gelu)", found.hint


def test_the_clean_twin_passes():
    report = verify_port(_spec(approximate=True), VerifyOptions(bisect=True))
    assert report.exit_code == 0 and not report.forward.diagnosis


class TorchGated(torch.nn.Module):
    """GELU inside the MLP, a ReLU on a gate after the norm."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D), torch.nn.LayerNorm(D)
        self.gate = torch.nn.Linear(D, D)

    def forward(self, x):
        h = self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))
        return h + torch.nn.functional.relu(self.gate(h))


class PaddleGatedSharing(paddle.nn.Layer):
    """One held activation (relu) used at both places: the MLP's is wrong, the gate's right."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = paddle.nn.Linear(D, 2 * D), paddle.nn.Linear(2 * D, D), paddle.nn.LayerNorm(D)
        self.gate = paddle.nn.Linear(D, D)
        self.activation = paddle.nn.functional.relu

    def forward(self, x):
        h = self.norm(x + self.fc2(self.activation(self.fc1(x))))
        return h + self.activation(self.gate(h))


def test_a_change_that_mends_the_child_s_input_and_breaks_the_output_is_no_cause():
    """Swapping the held relu for gelu mends fc2's input and breaks the gate: the layer's output
    under the change is judged too, and no cause is said to be confirmed."""
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(TorchGated(), torch.nn.Linear(D, 2)).eval()
    x = (np.random.RandomState(0).randn(2, 5, D) * 2).astype("float32")
    spec = spec_from_functions(torch_model, lambda: paddle.nn.Sequential(PaddleGatedSharing(), paddle.nn.Linear(D, 2)),
                               lambda: (x,))
    report = verify_port(spec, VerifyOptions(bisect=True))
    assert report.exit_code == 1 and report.forward.first_bad.torch == "0", report.forward.first_bad
    assert not [d for d in report.forward.diagnosis if "confirmed by re-running" in d.cause], report.forward.diagnosis


class TorchHalves(torch.nn.Module):
    """tanh GELU on the first half of the features, exact GELU on the second."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)

    def forward(self, x):
        h = self.fc1(x)
        a, b = h[..., :D], h[..., D:]
        F = torch.nn.functional
        return self.fc2(torch.cat([F.gelu(a, approximate="tanh"), F.gelu(b)], -1))


class PaddleHalves(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = paddle.nn.Linear(D, 2 * D), paddle.nn.Linear(2 * D, D)

    def forward(self, x):
        h = self.fc1(x)
        a, b = h[..., :D], h[..., D:]
        F = paddle.nn.functional
        return self.fc2(paddle.concat([F.gelu(a, approximate=True), F.gelu(b, approximate=True)], -1))


def test_a_call_among_several_of_one_function_is_named_by_its_place():
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(TorchHalves(), torch.nn.Linear(D, 2)).eval()
    x = (np.random.RandomState(0).randn(2, 5, D) * 3).astype("float32")
    spec = spec_from_functions(torch_model, lambda: paddle.nn.Sequential(PaddleHalves(), paddle.nn.Linear(D, 2)),
                               lambda: (x,))
    report = verify_port(spec, VerifyOptions(bisect=True))
    [found] = [d for d in report.forward.diagnosis if "confirmed by re-running" in d.cause]
    assert "gelu(..., approximate=True) (its call 2 of 2 there)" in found.cause, found.cause
    assert found.hint.endswith("pass approximate=False to gelu in 0's forward, in its call 2 of 2 there alone"), found.hint


class PaddleReluMLP(paddle.nn.Layer):
    """relu called directly where torch's MLP has GELU."""

    def __init__(self, act):
        super().__init__()
        self.fc1, self.fc2 = paddle.nn.Linear(D, 2 * D), paddle.nn.Linear(2 * D, D)
        self.act = act

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(paddle.nn.functional.relu(h) if self.act == "relu" else paddle.nn.functional.gelu(h))


class TorchGeluMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_an_activation_called_directly_is_tried_replaced_by_the_others(act):
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(TorchGeluMLP(), torch.nn.Linear(D, 2)).eval()
    x = np.random.RandomState(0).randn(2, 5, D).astype("float32")
    spec = spec_from_functions(torch_model, lambda: paddle.nn.Sequential(PaddleReluMLP(act), paddle.nn.Linear(D, 2)),
                               lambda: (x,))
    report = verify_port(spec, VerifyOptions(bisect=True))
    if act == "gelu":
        assert report.exit_code == 0 and not report.forward.diagnosis
        return
    [found] = [d for d in report.forward.diagnosis if "confirmed by re-running" in d.cause]
    assert found.cause.startswith("paddle's 0 calls paddle.nn.functional.relu; re-run on torch's recorded inputs with "
                                  "paddle.nn.functional.gelu in its place"), found.cause
    assert found.hint == "call gelu where 0's forward calls relu", found.hint
