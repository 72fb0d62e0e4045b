"""A verification puts back every framework flag, hook, train/eval mode and weight it changed, also
when the run fails: --precision strict turns TF32 off, and emulation adds hooks on torch's side and
rounds the inputs of paddle's products, only for the run."""

import numpy as np
import paddle
import pytest
import torch

from converter import PortSpec, VerifyOptions, verify_port
from converter.inmemory import convert_in_memory
from converter.errors import UserError
from converter.compare.restore import record_torch_flags
from helpers.threads import threads_of_a_new_thread

PADDLE_FLAGS = ("FLAGS_cublas_allow_tf32", "FLAGS_cudnn_allow_tf32")


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))


class PaddleNet(paddle.nn.Layer):
    """The port; its forward raises on call number `fail_on_call` (0: never), after noting what the
    run had changed by then."""

    def __init__(self, fail_on_call=0):
        super().__init__()
        self.fc1 = paddle.nn.Linear(8, 16)
        self.norm = paddle.nn.LayerNorm(16)
        self.act = paddle.nn.GELU()
        self.fc2 = paddle.nn.Linear(16, 4)
        self.fail_on_call = fail_on_call
        self.calls = 0
        self.seen_when_failing = None

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_on_call:
            self.seen_when_failing = {"flags": framework_flags(), "emulating": paddle_emulation(),
                                      "training": self.training}
            raise RuntimeError("planted failure")
        return self.fc2(self.act(self.norm(self.fc1(x))))


PADDLE_LINEAR = paddle._C_ops.linear


def paddle_emulation() -> bool:
    """Whether paddle's products round their inputs (the operator is not paddle's own)."""
    return paddle._C_ops.linear is not PADDLE_LINEAR


def framework_flags() -> dict:
    flags = {"torch.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "torch.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
             "torch.float32_matmul_precision": torch.get_float32_matmul_precision(),
             "paddle.device": paddle.get_device()}
    for name in PADDLE_FLAGS:
        try:
            flags[name] = paddle.get_flags([name])[name]
        except ValueError:  # a CPU build does not let one read them
            pass
    return flags


def model_state(torch_model, paddle_model) -> dict:
    """Weights as bytes, hook counts and train/eval modes of every module and layer of both models."""
    return {
        "torch weights": {k: v.detach().cpu().numpy().tobytes() for k, v in torch_model.state_dict().items()},
        "paddle weights": {k: v.numpy().tobytes() for k, v in paddle_model.state_dict().items()},
        "torch hooks": {n: (len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in torch_model.named_modules()},
        "paddle hooks": {n: (len(layer._forward_pre_hooks), len(layer._forward_post_hooks))
                         for n, layer in [("", paddle_model)] + list(paddle_model.named_sublayers())},
        "torch training": {n: m.training for n, m in torch_model.named_modules()},
        "paddle training": {n: layer.training for n, layer in [("", paddle_model)] + list(paddle_model.named_sublayers())},
    }


@pytest.fixture
def tf32_allowed():
    """torch set to allow TF32 (so that strict has something to turn off); the settings put back after."""
    put_back = record_torch_flags()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    yield
    put_back()


def _port(fail_on_call=0):
    """Both models built here (so the test can look at them after the run), in train mode and with a
    hook of the user's own on each side; the paddle model already holds torch's converted weights."""
    torch.manual_seed(0)
    paddle.seed(0)
    torch_model, paddle_model = TorchNet(), PaddleNet(fail_on_call)
    state = convert_in_memory(torch_model, paddle_model)[0]
    paddle_model.set_state_dict(state)
    torch_model.fc1.register_forward_hook(lambda m, args, out: None)
    paddle_model.fc2.register_forward_post_hook(lambda layer, args, out: None)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    spec = PortSpec(torch_model=lambda: torch_model, paddle_model=lambda: paddle_model, inputs=lambda: (x,))
    return spec, torch_model, paddle_model


OPTIONS = dict(device="cpu", precision="strict", emulate={"paddle": "tf32", "torch": "bf16"}, bisect=True)


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.slow
def test_a_run_puts_back_flags_hooks_modes_and_weights(tf32_allowed, strategy):
    spec, torch_model, paddle_model = _port()
    flags, state = framework_flags(), model_state(torch_model, paddle_model)
    report = verify_port(spec, VerifyOptions(strategy=strategy, **OPTIONS)).forward
    assert report.verdict == "pass", report.to_json()["first_bad_layer"]
    assert report.precision["paddle"]["effective"] == "tf32" and report.precision["torch"]["effective"] == "bf16"
    assert framework_flags() == flags
    assert model_state(torch_model, paddle_model) == state


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_run_that_fails_puts_them_back_too(tf32_allowed, strategy):
    spec, torch_model, paddle_model = _port(fail_on_call=2)
    flags, state = framework_flags(), model_state(torch_model, paddle_model)
    with pytest.raises(UserError, match="planted failure"):
        verify_port(spec, VerifyOptions(strategy=strategy, **OPTIONS))
    seen = paddle_model.seen_when_failing  # the failure came while the run had them changed
    assert seen["flags"]["torch.float32_matmul_precision"] == "highest" and not seen["training"]
    assert seen["emulating"] and not paddle_emulation()
    assert framework_flags() == flags
    assert model_state(torch_model, paddle_model) == state


def test_threads_started_after_a_run_get_torchs_thread_count_as_before():
    """The run sets thread counts on its worker threads; OpenMP hands the last one set to every thread
    started afterwards, unless the run puts it back."""
    spec, _, _ = _port()
    before = (torch.get_num_threads(), threads_of_a_new_thread())
    report = verify_port(spec, VerifyOptions(device="cpu", bisect=True)).forward
    assert report.verdict == "pass", report.to_json()["first_bad_layer"]
    assert (torch.get_num_threads(), threads_of_a_new_thread()) == before
