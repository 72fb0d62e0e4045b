"""The public Python API gives what the commands give: the same verdicts, culprits, diagnoses and
converted files, through the same result objects."""

import json
import os
import re
import subprocess
import sys

import pytest
from helpers.cli import ROOT, run_convert, run_verify, spec_path

from converter import PortSpec, VerifyOptions, convert_weights, verify_port
from converter.errors import UserError

BUNDLED = os.path.join(ROOT, "converter", "examples", "bert_port.py")


@pytest.mark.slow


def test_importing_the_api_imports_neither_framework():
    code = ("import sys, converter\n"
            "from converter import convert_weights, verify_port, PortSpec, VerifyOptions\n"
            "print(sorted(m for m in ('torch', 'paddle') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _judgement(body: dict) -> dict:
    """What a report concludes: verdict, culprit, diagnosis, and each pair's place and verdict."""
    return {"verdict": body["verdict"],
            "first_bad": None if body["first_bad_layer"] is None
            else {k: body["first_bad_layer"][k] for k in ("torch", "paddle", "type")},
            "diagnosis": [(d["layer"], d["cause"]) for d in body["diagnosis"]],
            "layers": [(r["torch"], r["paddle"], r["within_budget"]) for r in body["layers"]],
            "strategy": body["strategy"]}


@pytest.mark.parametrize("path, expected_exit", [(BUNDLED, 1), (spec_path("transformer_encoder"), 0)],
                         ids=["bundled-example", "clean-transformer-encoder"])
@pytest.mark.slow
def test_verify_port_concludes_what_the_command_concludes(tmp_path, path, expected_exit):
    cli = run_verify("--spec", path, "--device", "cpu", "--bisect", "--json", tmp_path / "cli.json")
    assert cli.code == expected_exit, cli
    report = verify_port(PortSpec.from_file(path), VerifyOptions(device="cpu", bisect=True))
    assert report.exit_code == expected_exit
    assert _judgement(report.to_json()) == _judgement(json.loads((tmp_path / "cli.json").read_text()))
    if expected_exit:
        assert report.first_bad.torch == "encoder.layer.0.intermediate.intermediate_act_fn"
        assert "GELU" in report.diagnosis[0].cause


def test_a_spec_given_in_python_is_verified_like_its_file():
    """PortSpec(torch_model=..., paddle_model=..., inputs=...) from a spec file's own functions,
    with the models handed over already built: the same conclusion as the file."""
    module = PortSpec.from_file(spec_path("cnn")).module
    spec = PortSpec(torch_model=module.torch_model(), paddle_model=module.paddle_model, inputs=module.inputs,
                    mapping=getattr(module, "mapping", None))
    in_python = verify_port(spec, VerifyOptions(device="cpu"))
    from_file = verify_port(PortSpec.from_file(spec_path("cnn")), VerifyOptions(device="cpu"))
    assert in_python.verdict == from_file.verdict == "pass"
    assert _judgement(in_python.to_json()) == _judgement(from_file.to_json())


def _training(body: dict) -> dict:
    """What a training report concludes: verdict, culprit, every check's place and verdict, the steps."""
    return {"verdict": body["verdict"], "first_bad": body["first_bad"], "diagnosis": body["diagnosis"],
            "checks": [(c["phase"], c["step"], c["torch"], c["paddle"], c["ratio"] is not None and c["ratio"] <= 1)
                       for c in body["checks"]],
            "steps": [(s["step"], s["loss_torch"], s["lr_torch"], s["lr_paddle"]) for s in body["steps"]],
            "optimizer": body["optimizer"]}


@pytest.mark.slow


def test_verify_port_with_train_returns_the_report_the_command_renders(tmp_path):
    cli = run_verify("--spec", spec_path("train_mlp"), "--train", "--steps", 3, "--device", "cpu",
                     "--json", tmp_path / "cli.json")
    assert cli.code == 0, cli
    trained = verify_port(PortSpec.from_file(spec_path("train_mlp")), VerifyOptions(device="cpu", train=True, steps=3))
    assert type(trained).__name__ == "TrainReport" and trained.exit_code == 0 and len(trained.steps) == 3
    assert _training(trained.to_json()) == _training(json.loads((tmp_path / "cli.json").read_text())["train"])
    from converter.train.report import render_text
    first_line = render_text(trained).splitlines()[0]
    assert first_line in cli.stdout


@pytest.mark.slow


def test_training_parts_given_in_python_are_used():
    """A spec's training parts handed to PortSpec(...): the file's own functions give the file's
    report; a paddle loss summed where torch's is the mean is named in phase loss."""
    import paddle
    module = PortSpec.from_file(spec_path("train_mlp")).module
    parts = dict(batches=module.batches(), torch_loss=module.torch_loss, paddle_loss=module.paddle_loss,
                 torch_optimizer=module.torch_optimizer)
    options = VerifyOptions(device="cpu", train=True, steps=2)
    same = verify_port(PortSpec(module.torch_model, module.paddle_model, module.inputs, **parts), options)
    from_file = verify_port(PortSpec.from_file(spec_path("train_mlp")), options)
    assert same.verdict == "pass" and _training(same.to_json()) == _training(from_file.to_json())
    parts["paddle_loss"] = lambda o, t: paddle.nn.functional.cross_entropy(o, t, reduction="sum")
    summed = verify_port(PortSpec(module.torch_model, module.paddle_model, module.inputs, **parts), options)
    assert summed.exit_code == 1 and summed.first_bad.phase == "loss"
    assert "reduction" in summed.diagnosis[0].cause
    with pytest.raises(UserError, match="clip_grad_norm must be a positive number"):
        verify_port(PortSpec(module.torch_model, module.paddle_model, module.inputs, clip_grad_norm=-1.0), options)


def test_the_documented_training_example_runs(monkeypatch):
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (code,) = [b for b in blocks if "train=True" in b and "tests/specs/" in b]
    monkeypatch.chdir(ROOT)
    namespace = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)
    assert namespace["trained"].verdict == "pass" and len(namespace["trained"].steps) == 3


@pytest.mark.slow


def test_convert_weights_writes_what_the_command_writes(tmp_path):
    import torch
    spec = PortSpec.from_file(spec_path("transformer_encoder"))
    src = tmp_path / "model.pt"
    torch.save(spec.torch_model().state_dict(), src)
    cli = run_convert(src, tmp_path / "cli.pdparams", "--spec", spec_path("transformer_encoder"),
                      "--json", tmp_path / "cli.json")
    assert cli.code == 0, cli
    result = convert_weights(str(src), str(tmp_path / "api.pdparams"), spec=spec_path("transformer_encoder"))
    assert result.ok and result.missing_keys == [] and result.unexpected_keys == []
    assert (tmp_path / "api.pdparams").read_bytes() == (tmp_path / "cli.pdparams").read_bytes()
    cli_body = json.loads((tmp_path / "cli.json").read_text())
    api_body = result.to_json()
    for key in ("format", "mapping", "tensors", "bytes", "dropped", "ok"):
        assert api_body[key] == cli_body[key], key


def test_convert_weights_refuses_bad_input_and_writes_nothing(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        convert_weights(str(tmp_path / "missing.safetensors"), str(tmp_path / "out.pdparams"))
    assert not (tmp_path / "out.pdparams").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "gpu"}, "device must be one of auto, cpu, cuda; got 'gpu'"),
    ({"precision": "fp64"}, "precision must be one of as-is, strict"),
    ({"strategy": "fast"}, "strategy must be one of auto, full, binary"),
    ({"emulate": {"jax": "tf32"}}, "emulate side must be one of torch, paddle"),
    ({"emulate": {"paddle": "fp8"}}, "emulate format for paddle must be one of tf32, bf16, fp16"),
    ({"emulate": "paddle=tf32"}, "emulate must be a dict"),
    ({"train": "yes"}, "train must be True or False; got 'yes'"),
    ({"train": True, "steps": 0}, "steps must be a whole number from 1 to 10000; got 0"),
    ({"train": True, "steps": "3"}, "steps must be a whole number from 1 to 10000; got '3'"),
    ({"train": True, "steps": True}, "steps must be a whole number from 1 to 10000; got True"),
])
def test_bad_options_are_one_clear_error(kwargs, message):
    with pytest.raises(UserError, match=message):
        VerifyOptions(**kwargs)


def test_a_spec_of_the_wrong_parts_is_one_clear_error():
    with pytest.raises(UserError, match="torch_model must be a function returning the model, not int"):
        PortSpec(torch_model=3, paddle_model=lambda: None, inputs=lambda: {})
    with pytest.raises(UserError, match=re.escape("torch_loss must be a function (output, target) -> scalar tensor, "
                                                  "not int")):
        PortSpec(torch_model=lambda: None, paddle_model=lambda: None, inputs=lambda: {}, torch_loss=3)
    with pytest.raises(UserError, match="paddle_optimizer must be a function"):
        PortSpec(torch_model=lambda: None, paddle_model=lambda: None, inputs=lambda: {}, paddle_optimizer="AdamW")
    with pytest.raises(UserError, match="takes a PortSpec"):
        verify_port(BUNDLED)


def test_both_framework_adapters_meet_the_adapter_protocol():
    """Every function FrameworkAdapter names exists in torch_side and paddle_side with the same
    parameters, so code written against one adapter runs against the other."""
    import inspect

    from converter.frameworks import FrameworkAdapter, paddle_side, torch_side
    members = [name for name, value in vars(FrameworkAdapter).items()
               if inspect.isfunction(value) and not name.startswith("_")]
    assert members
    for name in members:
        wanted = list(inspect.signature(getattr(FrameworkAdapter, name)).parameters)[1:]  # less self
        for adapter in (torch_side, paddle_side):
            assert list(inspect.signature(getattr(adapter, name)).parameters) == wanted, (adapter.__name__, name)
