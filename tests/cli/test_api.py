"""The public Python API gives what the commands give: the same verdicts, culprits, diagnoses and
converted files, through the same result objects."""

import json
import os
import re
import subprocess
import sys

import pytest
from helpers.cli import ROOT, run_convert, run_verify, spec_path

from converter import (ConversionResult, DirectoryConversion, OptionError, PortReport, PortSpec, Report, TrainReport,
                       UserError, VerifyOptions, convert_directory, convert_weights, converts_a_directory,
                       translated_optimizer, verify_port)

BUNDLED = os.path.join(ROOT, "converter", "examples", "bert_port.py")


@pytest.mark.slow


def test_importing_the_api_imports_neither_framework():
    """Every name converter exports (the API, its result and error types) is there, and none of
    them brings in either framework."""
    code = ("import sys, converter\n"
            "from converter import *\n"
            "print(sorted(m for m in ('torch', 'paddle') if m in sys.modules))\n"
            "print(len(converter.__all__), sum(n in globals() for n in converter.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    frameworks, counts = out.stdout.strip().splitlines()
    assert frameworks == "[]"
    exported, found = map(int, counts.split())
    assert exported == found >= 15


def test_the_exported_types_are_the_ones_results_and_errors_have():
    import converter.api
    import converter.errors
    from converter.convert import ConversionResult as Converted
    from converter.report import PortReport as Composed
    from converter.results import Verdict as Verdicts
    from converter.train.result import TrainReport as Trained
    from converter.verify.report import Report as Forward
    assert (Report, TrainReport, ConversionResult, PortReport) == (Forward, Trained, Converted, Composed)
    assert converter.Verdict is Verdicts and OptionError is converter.api.OptionError
    assert UserError is converter.errors.UserError and issubclass(OptionError, UserError)
    with pytest.raises(AttributeError, match="has no attribute 'run_checks'"):
        converter.run_checks  # noqa: B018 - the attribute access is the test


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
    assert report.train is None and report.verdict == report.forward.verdict
    if expected_exit:
        assert report.forward.first_bad.torch == "encoder.layer.0.intermediate.intermediate_act_fn"
        assert "GELU" in report.forward.diagnosis[0].cause


@pytest.mark.slow
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
    """One report holding both checks, as verify-port --train gives them: the training checks and
    the forward check, the same JSON and the same lines."""
    cli = run_verify("--spec", spec_path("train_mlp"), "--train", "--steps", 3, "--device", "cpu",
                     "--json", tmp_path / "cli.json")
    assert cli.code == 0, cli
    both = verify_port(PortSpec.from_file(spec_path("train_mlp")), VerifyOptions(device="cpu", train=True, steps=3))
    assert isinstance(both, PortReport) and both.exit_code == 0 and both.verdict == "pass"
    assert isinstance(both.train, TrainReport) and len(both.train.steps) == 3
    assert isinstance(both.forward, Report) and both.forward.layers
    cli_body = json.loads((tmp_path / "cli.json").read_text())
    assert _training(both.to_json()["train"]) == _training(cli_body["train"])
    assert _judgement(both.to_json()) == _judgement(cli_body)
    from converter.train.report import render_text as train_text
    from converter.verify.report import render_text as forward_text
    train_lines, forward_lines = train_text(both.train).splitlines(), forward_text(both.forward).splitlines()
    assert cli.stdout.splitlines()[:2] == train_lines[:2]  # the training checks first, as they ran
    assert forward_lines[0] in cli.stdout


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
    assert same.verdict == "pass" and _training(same.train.to_json()) == _training(from_file.train.to_json())
    parts["paddle_loss"] = lambda o, t: paddle.nn.functional.cross_entropy(o, t, reduction="sum")
    summed = verify_port(PortSpec(module.torch_model, module.paddle_model, module.inputs, **parts), options)
    assert summed.train.first_bad.phase == "loss" and "reduction" in summed.train.diagnosis[0].cause
    # the forward check, which no loss enters, passes; the report fails with the training checks
    assert summed.forward.verdict == "pass" and summed.train.verdict == "fail"
    assert summed.verdict == "fail" and summed.exit_code == 1
    # the page is headed by the composed verdict and leads with the failed training checks' culprit
    from converter.report import render_html
    page = render_html(summed)
    assert "<h1>verify-port: FAIL</h1>" in page
    assert page.index("<h2>Training checks: FAIL</h2>") < page.index("<th>layer</th>")
    with pytest.raises(UserError, match="clip_grad_norm must be a positive number"):
        verify_port(PortSpec(module.torch_model, module.paddle_model, module.inputs, clip_grad_norm=-1.0), options)


def test_the_documented_training_example_runs(monkeypatch):
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (code,) = [b for b in blocks if "train=True" in b and "tests/specs/" in b]
    monkeypatch.chdir(ROOT)
    namespace = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)
    both = namespace["both"]
    assert both.verdict == "pass" and len(both.train.steps) == 3 and both.forward.layers


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
    ({"max_memory": 0}, "max_memory must be a number of bytes above 0, or None; got 0"),
    ({"max_memory": "6GiB"}, "max_memory must be a number of bytes above 0, or None; got '6GiB'"),
    ({"max_memory": True}, "max_memory must be a number of bytes above 0, or None; got True"),
])
def test_bad_options_are_one_clear_error(kwargs, message):
    with pytest.raises(UserError, match=message):
        VerifyOptions(**kwargs)


@pytest.mark.parametrize("kwargs, option, value", [
    ({"device": "gpu"}, "device", "gpu"),
    ({"emulate": {"jax": "tf32"}}, "emulate", ("jax", "tf32")),
    ({"emulate": {"paddle": "fp8"}}, "emulate", ("paddle", "fp8")),
    ({"steps": 10_001}, "steps", 10_001),
])
def test_a_refused_option_says_which_as_data(kwargs, option, value):
    """The command line words its own message from these: the option and the value refused."""
    with pytest.raises(OptionError) as refused:
        VerifyOptions(**kwargs)
    assert (refused.value.option, refused.value.value) == (option, value)
    assert refused.value.exit_code == 2


def test_the_translated_optimizer_is_paddle_code_and_none_is_refused(tmp_path):
    code = translated_optimizer(PortSpec.from_file(spec_path("train_mlp")))
    assert code.startswith("import paddle") and "def paddle_optimizer(model):" in code
    assert "paddle.optimizer.AdamW(" in code
    compile(code, "optimizer.py", "exec")
    own = tmp_path / "own_optimizer.py"
    own.write_text(open(spec_path("train_mlp")).read()
                   + "\n\ndef torch_optimizer(model):\n    return torch.optim.Adadelta(model.parameters())\n"
                   "\n\ndef paddle_optimizer(model):\n    return paddle.optimizer.Adadelta(parameters=model.parameters())\n")
    with pytest.raises(UserError, match="there is nothing to write"):
        translated_optimizer(PortSpec.from_file(str(own)))


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


@pytest.mark.slow
def test_convert_directory_writes_what_the_command_writes(tmp_path):
    """An HF model directory into a directory, through the API as through convert-weights HF_DIR
    OUT_DIR: the same files, byte for byte, and the same JSON."""
    from helpers.hf_models import BERT, hf_dir, hf_state
    src = hf_dir(tmp_path / "hf", hf_state(BERT), shards=2)
    assert converts_a_directory(str(src), str(tmp_path / "api"))
    assert not converts_a_directory(str(src), str(tmp_path / "model.pdparams"))
    assert not converts_a_directory(str(tmp_path), str(tmp_path / "api"))  # no config.json
    cli = run_convert(src, tmp_path / "cli", "--quiet", "--json", tmp_path / "cli.json")
    assert cli.code == 0, cli
    lines = []
    done = convert_directory(str(src), str(tmp_path / "api"), log=lines.append, json_path=str(tmp_path / "api.json"))
    assert isinstance(done, DirectoryConversion) and done.mapping == "bert" and done.tensors > 0
    files = sorted(os.listdir(tmp_path / "cli"))
    assert sorted(done.files) == files == sorted(os.listdir(tmp_path / "api"))
    for name in files:
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    api_body, cli_body = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("api", "cli"))
    assert api_body == done.to_json() == dict(cli_body, output=api_body["output"])
    assert api_body["output"] == str(tmp_path / "api") and cli_body["output"] == str(tmp_path / "cli")
    assert any("mapping: 'bert'" in line for line in lines) and all(line in cli.stderr for line in lines)


def test_convert_directory_refuses_bad_input_and_writes_nothing(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="config.json"):
        convert_directory(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["hf"]


@pytest.mark.slow
def test_the_training_table_of_a_page_shows_the_checks_that_matter():
    """Hundreds of training checks: the page's table holds the rows over budget and each phase's
    worst, says how many it leaves out, and the JSON keeps every check."""
    import re

    from converter.report import render_html
    from converter.train.result import PHASES
    report = verify_port(PortSpec.from_file(spec_path("train_transformer")),
                         VerifyOptions(device="cpu", train=True, steps=2))
    rows = report.train.rows
    page = render_html(report)
    said = re.search(r"<p>(\d+) checks; the table shows the (\d+) over budget or worst in their phase", page)
    assert said is not None and int(said[1]) == len(rows) > 60
    section = page[page.index("<h2>Training checks"):]
    table = section[section.index("<table"):section.index("</table>")]
    worst = [report.train.worst(phase) for phase in PHASES if report.train.worst(phase) is not None]
    shown = {id(r) for r in worst} | {id(r) for r in rows if r.bad}
    assert table.count("<tr") - 1 == int(said[2]) == len(shown)
    assert len(report.train.to_json()["checks"]) == len(rows)
