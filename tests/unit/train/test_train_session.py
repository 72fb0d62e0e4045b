"""--train and the forward check on one PortSession: one conversion and one float64 copy, the
forward check's emulation off while the training checks run, and one rule for errors: what the
user's model raises is bad input (exit 2), what this package's own hook code raises is an
internal error (exit 3), in the training checks as in the forward check."""

import json

import paddle
import pytest
from click.testing import CliRunner

from helpers.cli import spec_path
from converter.api import VerifyOptions, verify_port
from converter.compare import capture
from converter.compare.session import Options, PortSession
from converter.errors import UserError
from converter.spec import PortSpec
from converter.train import loop
from helpers.train import train_check
from helpers.threads import threads_of_a_new_thread

STEPS = 2


def _mlp(**overrides):
    spec = PortSpec.from_file(spec_path("train_mlp"))
    for name, value in overrides.items():
        setattr(spec.module, name, value)
    return spec


def _counted(spec) -> list:
    """Count the calls of the spec's model builders (each session set-up calls each once)."""
    calls = []
    for name in ("torch_model", "paddle_model"):
        build = getattr(spec.module, name)

        def counting(_build=build, _name=name):
            calls.append(_name)
            return _build()
        setattr(spec.module, name, counting)
    return calls


def _broken_recorder(model, record):
    """A hook of this package that fails in its own code (a bug), on every forward of the model."""
    return [model.register_forward_pre_hook(lambda module, args: capture.Recorder.stale(None))]


def test_train_and_forward_share_one_session():
    """--train builds the models and converts the weights once, and gives the same verdicts and
    numbers as the two checks run apart."""
    spec = _mlp()
    calls = _counted(spec)
    both = verify_port(spec, VerifyOptions(device="cpu", train=True, steps=STEPS))
    report, trained = both.forward, both.train
    assert calls == ["torch_model", "paddle_model"]
    alone_train = train_check(_mlp(), steps=STEPS, device="cpu")
    alone_forward = verify_port(_mlp(), VerifyOptions(device="cpu")).forward
    assert trained.verdict == alone_train.verdict == "pass"
    assert report.verdict == alone_forward.verdict == "pass"
    assert json.dumps(trained.to_json(), sort_keys=True) == json.dumps(alone_train.to_json(), sort_keys=True)
    assert [(r.torch, r.ratio) for r in report.layers] == [(r.torch, r.ratio) for r in alone_forward.layers]


def test_training_turns_the_forward_emulation_off_and_back_on():
    """The forward check's --emulate hooks (on the torch model) and paddle's rounding operators
    are off while the training checks run on copies of the models, and on again after."""
    original_matmul = paddle._C_ops.matmul
    with PortSession(_mlp(), Options(device="cpu", emulate={"torch": "bf16", "paddle": "bf16"})) as session:
        hooked = len(session.torch_model.fc1._forward_pre_hooks)
        assert hooked > 0 and paddle._C_ops.matmul is not original_matmul
        with session.training():
            assert len(session.torch_model.fc1._forward_pre_hooks) == hooked - 1
            assert paddle._C_ops.matmul is original_matmul
        assert len(session.torch_model.fc1._forward_pre_hooks) == hooked
        assert paddle._C_ops.matmul is not original_matmul
    assert paddle._C_ops.matmul is original_matmul
    assert len(session.torch_model.fc1._forward_pre_hooks) == 0


def test_emulated_training_on_the_shared_session_matches_training_alone():
    """With --emulate, the training checks on the forward check's session (its emulation set up)
    give what they give on a session of their own."""
    emulate = {"paddle": "bf16"}
    trained = verify_port(_mlp(), VerifyOptions(device="cpu", emulate=emulate, train=True, steps=STEPS)).train
    alone = train_check(_mlp(), steps=STEPS, device="cpu", emulate=emulate)
    assert trained.formats == alone.formats and trained.formats["paddle"] == "bf16"
    assert json.dumps(trained.to_json(), sort_keys=True) == json.dumps(alone.to_json(), sort_keys=True)


def test_an_error_in_our_own_training_hooks_is_an_internal_error(monkeypatch):
    """An exception raised in this package's own hook code during a training run is left as it
    is (exit 3 at the command line), not 'torch_model() in training mode fails on batches()[0]'."""
    monkeypatch.setattr(loop, "_bn_recorder", _broken_recorder)
    with pytest.raises(AttributeError, match="_versions"):
        train_check(_mlp(), steps=STEPS, device="cpu")


def test_an_error_in_our_own_training_hooks_exits_3_at_the_command_line(monkeypatch):
    from converter.cli import verify_port as command
    monkeypatch.setattr(loop, "_bn_recorder", _broken_recorder)
    monkeypatch.delenv("CONVERTER_DEBUG", raising=False)
    r = CliRunner().invoke(command, ["--spec", spec_path("train_mlp"), "--device", "cpu", "--train", "--steps", "2"])
    assert r.exit_code == 3, r.output
    assert "internal error: AttributeError" in r.output and "fails on" not in r.output


def test_an_error_in_the_users_model_in_training_is_bad_input():
    spec = _mlp()

    class TrainingBug(spec.module.TorchMLP):  # a bug of the model's own that shows in training mode only
        def forward(self, x):
            if self.training:
                raise RuntimeError("the model's own bug in training")
            return super().forward(x)
    spec.module.torch_model = TrainingBug
    with pytest.raises(UserError, match=r"torch_model\(\) in training mode fails on batches\(\)\[0\].*"
                                        r"the model's own bug in training"):
        train_check(spec, steps=STEPS, device="cpu")


def test_an_error_in_the_users_model_in_training_exits_2_at_the_command_line(tmp_path):
    source = open(spec_path("train_mlp")).read()
    bad = source.replace("    def forward(self, x):\n        return self.fc2(self.drop(torch.nn",
                         "    def forward(self, x):\n        if self.training:\n"
                         "            raise RuntimeError('the model bug in training')\n"
                         "        return self.fc2(self.drop(torch.nn", 1)
    assert bad != source
    path = tmp_path / "train_bad.py"
    path.write_text(bad)
    from converter.cli import verify_port as command
    r = CliRunner().invoke(command, ["--spec", str(path), "--device", "cpu", "--train", "--steps", "2"])
    assert r.exit_code == 2, r.output
    assert "fails on batches()[0]" in r.output and "the model bug in training" in r.output
    assert "internal error" not in r.output and "Traceback" not in r.output


def test_the_checks_copies_run_on_one_thread_and_torchs_thread_count_is_put_back():
    """one_thread holds torch's CPU work to one thread and puts the count back, on an error too; a
    --train run leaves the count as it found it, on this thread and on a thread started afterwards."""
    import torch

    from converter.train.session import one_thread
    before = (torch.get_num_threads(), threads_of_a_new_thread())
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before[0]
    with pytest.raises(RuntimeError, match="inside"), one_thread():
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before[0]
    report = verify_port(_mlp(), VerifyOptions(device="cpu", train=True, steps=STEPS))
    assert report.train.verdict == "pass"
    assert (torch.get_num_threads(), threads_of_a_new_thread()) == before
