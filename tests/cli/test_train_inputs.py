"""verify-port --train on bad training parts of a spec: each is exit 2 with one line saying what is
wrong and what to do, no traceback and no report file; parts given in the other accepted forms
(batches as a list, float64 arrays) are used as given."""

import json

import pytest

from helpers.cli import run_verify

BASE = '''
import numpy as np, paddle, torch


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(6, 8)
        self.fc2 = paddle.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(paddle.tanh(self.fc1(x)))


def torch_model():
    torch.manual_seed(0)
    return TorchNet()


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.standard_normal((4, 6)).astype(np.float32),), rng.integers(0, 3, 4)) for _ in range(2)]


def torch_loss(o, t):
    return torch.nn.functional.cross_entropy(o, t)


def paddle_loss(o, t):
    return paddle.nn.functional.cross_entropy(o, t)


def torch_optimizer(m):
    return torch.optim.Adam(m.parameters(), lr=1e-2)
'''

SGD = "\ndef paddle_optimizer(m):\n    return paddle.optimizer.SGD(0.1, parameters=m.parameters())\n"
BATCHNORM = '''
class TorchBN(TorchNet):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


class PaddleBN(PaddleNet):
    def __init__(self):
        super().__init__()
        self.bn = paddle.nn.BatchNorm1D(8, momentum=0.9)

    def forward(self, x):
        return self.fc2(paddle.tanh(self.bn(self.fc1(x))))


def torch_model():
    torch.manual_seed(0)
    return TorchBN()


def paddle_model():
    return PaddleBN()
'''

CASES = {
    # name: (code appended to BASE, words of the one line)
    "loss-not-reduced": ("def torch_loss(o, t):\n    return torch.nn.functional.cross_entropy(o, t, reduction='none')",
                         "torch_loss(output, target) must return a scalar tensor; got a tensor of shape [4]"),
    "loss-a-float": ("def paddle_loss(o, t):\n    return 1.0", "paddle_loss(output, target) must return a scalar tensor"),
    "loss-detached": ("def torch_loss(o, t):\n    return torch.nn.functional.cross_entropy(o.detach(), t)",
                      "torch_loss(output, target) returns a loss that does not depend on the output"),
    "loss-an-accuracy": ("def torch_loss(o, t):\n    return (o.argmax(1) == t).sum()",
                         "returns a loss that does not depend on the output"),
    "paddle-loss-a-constant": ("def paddle_loss(o, t):\n    return paddle.to_tensor(1.0)",
                               "paddle_loss(output, target) returns a loss that does not depend on the output"),
    "paddle-loss-backward-fails": ("def paddle_loss(o, t):\n    return paddle.nn.functional.cross_entropy(o, "
                                   "t.astype('float32'))", "paddle_loss's backward fails on batches()[0]"),
    "loss-on-one-side": ("del paddle_loss", "defines torch_loss but not paddle_loss: give both"),
    "loss-not-a-function": ("torch_loss = 3", "torch_loss must be a function (output, target)"),
    "loss-without-target": ("del batches", "the target is None: the spec has no batches()"),
    "no-float-output-for-the-default-loss": (
        "del batches, torch_loss, paddle_loss\n_t = TorchNet.forward\nTorchNet.forward = lambda self, x: "
        "_t(self, x).argmax(-1)\n_p = PaddleNet.forward\nPaddleNet.forward = lambda self, x: _p(self, x).argmax(-1)",
        "returns no floating-point tensor, and the default loss is a projection"),
    "paddle-optimizer-alone": ("del torch_optimizer" + SGD, "defines paddle_optimizer but not torch_optimizer"),
    "untranslatable-optimizer": ("def torch_optimizer(m):\n    return torch.optim.ASGD(m.parameters())",
                                 "torch optimizer ASGD has no translation here"),
    "not-a-scheduler": ("def torch_optimizer(m):\n    o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                        "    return o, 'cosine'" + SGD, "got str as the scheduler"),
    "scheduler-on-a-metric": ("def torch_optimizer(m):\n    o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                              "    return o, torch.optim.lr_scheduler.ReduceLROnPlateau(o)" + SGD,
                              "ReduceLROnPlateau, which steps on a metric"),
    "paddle-scheduler-not-one": ("def paddle_optimizer(m):\n    return paddle.optimizer.SGD(0.1, parameters="
                                 "m.parameters()), 'x'", "got str as the scheduler"),
    "batch-of-the-wrong-width": ("def batches():\n    return [((np.zeros((4, 5), np.float32),), np.zeros(4, np.int64))]",
                                 "torch_model() in training mode fails on batches()[0]: RuntimeError"),
    "second-batch-wrong": ("_b = batches\ndef batches():\n    return _b()[:1] + [((np.zeros((4, 7), np.float32),), "
                           "np.zeros(4, np.int64))]", "fails on batches()[1]"),
    "inputs-of-the-wrong-width": ("def inputs():\n    return (np.zeros((4, 5), np.float32),)\n"
                                  "del batches, torch_loss, paddle_loss", "fails on inputs(): RuntimeError"),
    "batchnorm-on-one-sample": (BATCHNORM + "def batches():\n    return [((np.ones((1, 6), np.float32),), "
                                "np.zeros(1, np.int64))]", "Expected more than 1 value per channel"),
    "float32-constant-in-float64": (
        "TorchNet.forward = lambda self, x: self.fc2(torch.tanh(x @ self.fc1.weight.float().T + self.fc1.bias.float()))",
        "torch_model() in float64 fails on batches()[0]"),
    "nothing-trainable": ("_m = torch_model\ndef torch_model():\n    return _m().requires_grad_(False)",
                          "has no trainable parameter"),
}


def _run(tmp, code, *extra):
    spec = tmp / "spec.py"
    spec.write_text(BASE + "\n" + code + "\n")
    out = tmp / "r.json"
    return run_verify("--spec", spec, "--train", "--steps", 3, "--device", "cpu", "--json", out, *extra), out


@pytest.mark.parametrize("case", list(CASES))
def test_bad_training_part_is_exit_2_with_one_line(tmp, case):
    code, words = CASES[case]
    r, out = _run(tmp, code)
    assert r.code == 2, r
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], r
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr
    assert not out.exists()


def test_batches_as_a_list_and_float64_arrays_are_used(tmp):
    """batches given as a list (not a function) trains on those batches; float64 inputs and soft
    targets reach both sides in float32 and the clean port passes."""
    code = ("batches = [((np.random.default_rng(k).standard_normal((4, 6)),), "
            "np.random.default_rng(k).dirichlet(np.ones(3), 4)) for k in range(2)]\n"
            "def paddle_loss(o, t):\n    return paddle.nn.functional.cross_entropy(o, t, soft_label=True)")
    r, out = _run(tmp, code)
    assert r.code == 0, r
    train = json.loads(out.read_text())["train"]
    assert not any("no batches()" in n for n in train["notes"])
    import numpy as np
    import torch
    namespace = {}
    exec(compile((tmp / "spec.py").read_text(), "spec", "exec"), namespace)
    (x,), t = namespace["batches"][0]
    with torch.no_grad():
        first = torch.nn.functional.cross_entropy(namespace["torch_model"]()(torch.from_numpy(x).float()),
                                                  torch.from_numpy(t).float())
    assert train["steps"][0]["loss_torch"] == pytest.approx(float(first), rel=1e-6)
    assert np.isfinite(train["steps"][1]["loss_paddle"])
