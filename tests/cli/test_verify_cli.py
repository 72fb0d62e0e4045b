"""verify-port as a user runs it: the bundled default, reports, strategies and bad input."""

import json
import math

import pytest

from helpers.cli import run_script, run_verify, spec_path
from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options


@pytest.mark.slow
def test_bundled_default_names_the_culprit_and_diagnosis(tmp):
    r = run_script("verify-port", "--bisect", "--json", tmp / "r.json", "--html", tmp / "r.html")
    assert r.code == 1, r
    assert "Traceback" not in r.stderr and "ccache" not in r.stderr + r.stdout
    assert "FAIL: first layer over budget: encoder.layer.0.intermediate.intermediate_act_fn" in r.stdout
    body = json.loads((tmp / "r.json").read_text())
    assert body["verdict"] == "fail"
    assert body["first_bad_layer"] == {"torch": "encoder.layer.0.intermediate.intermediate_act_fn",
                                       "paddle": "encoder.layer.0.intermediate.intermediate_act_fn",
                                       "type": "GELU", "ratio": body["first_bad_layer"]["ratio"]}
    assert body["diagnosis"][0]["cause"].startswith("GELU variant")
    for layer in body["layers"]:
        assert {"torch", "paddle", "type", "max_abs", "mean_abs", "budget", "ratio", "local_max_abs",
                "local_ratio", "within_budget"} <= set(layer)
    assert set(body["precision"]) == {"torch", "paddle"}
    page = (tmp / "r.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page
    # the plot's point for the culprit names it on hover, and the closest table lists it first
    assert "<title>encoder.layer.0.intermediate.intermediate_act_fn (GELU): ratio" in page
    closest = page[page.index("<h3>Closest to their budget</h3>"):]
    first_row = closest[closest.index("<tr class"):closest.index("</tr>", closest.index("<tr class"))]
    assert "encoder.layer.0.intermediate.intermediate_act_fn" in first_row
    assert "src=" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def _planted_bert(name):
    """(spec, bug) for one of the planted BERT bugs."""
    import sys
    from helpers.cli import SPECS
    sys.path.insert(0, SPECS)
    from helpers.planted import BERT_BUGS, clean_bert
    from converter.examples import bert_port as B
    bug = next(b for b in BERT_BUGS if b.name == name)

    def paddle_model():
        m = clean_bert()
        bug.mutate_model(m)
        return m
    return spec_from_functions(B.torch_model, paddle_model, B.inputs), bug


@pytest.mark.slow


def test_binary_search_finds_the_same_culprit_within_its_pass_budget():
    from converter.examples import bert_port as B
    spec, bug = _planted_bert("dropped-residual")
    report = verify(spec, Options(device="cpu", strategy="binary"), bisect=True)
    assert report.strategy == "binary"
    assert report.first_bad.torch == bug.culprit
    units = B.LAYERS + 2  # embeddings, each layer, the model
    assert report.passes <= math.ceil(math.log2(units)) + 3
    assert any("own forward" in d.cause for d in report.diagnosis)


def test_binary_search_passes_a_clean_port():
    report = verify(__import__("converter.spec", fromlist=["load_spec"]).load_spec(spec_path("transformer_encoder")),
                    Options(device="cpu", strategy="binary"))
    assert report.verdict == "pass"


@pytest.mark.parametrize("args,words", [
    (["--spec", "no/such/spec.py"], ["spec file", "does not exist"]),
    (["--converted", "missing.pdparams"], ["--converted", "does not exist"]),
    (["--emulate", "paddle=int8"], ["--emulate", "SIDE=MODE"]),
    (["--device", "cuda"], ["no GPU"]),
])
def test_bad_input_is_one_line_exit_2(args, words):
    r = run_verify(*args)
    assert r.code == 2, r
    assert "Traceback" not in r.stderr + r.stdout
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_spec_without_functions(tmp):
    (tmp / "spec.py").write_text("def torch_model():\n    return None\n")
    r = run_verify("--spec", tmp / "spec.py")
    assert r.code == 2 and "does not define paddle_model(), inputs()" in r.stderr


def test_converted_file_that_is_a_hostile_pickle(tmp):
    import pickle
    import os

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp / 'pwned'}",))
    (tmp / "evil.pdparams").write_bytes(pickle.dumps({"w": Exploit()}))
    r = run_verify("--spec", spec_path("seed_report"), "--converted", tmp / "evil.pdparams")
    assert r.code == 2 and "refusing to read" in r.stderr
    assert not (tmp / "pwned").exists()


@pytest.mark.slow
def test_converted_file_for_another_model_is_one_line_and_not_loaded(tmp):
    from safetensors.numpy import save_file

    from helpers.cli import run_convert
    from converter.spec import load_spec
    cnn = load_spec(spec_path("cnn")).torch_model()
    save_file({k: v.detach().numpy().copy() for k, v in cnn.state_dict().items()}, str(tmp / "cnn.safetensors"))
    assert run_convert(tmp / "cnn.safetensors", tmp / "cnn.pdparams", "--spec", spec_path("cnn")).code == 0
    r = run_script("verify-port", "--spec", spec_path("seed_report"), "--converted", tmp / "cnn.pdparams")
    assert r.code == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit the paddle model" in lines[0] and "query_proj.weight" in lines[0], lines
    assert "convert it again" in lines[0]


def test_a_port_whose_forward_raises_is_one_line(tmp):
    (tmp / "spec.py").write_text(
        "import numpy as np, paddle, torch\n"
        "class Wrap(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(4, 3)\n"
        "    def forward(self, x):\n        return self.fc(x)\n"
        "def torch_model():\n    return Wrap()\n"
        "class Broken(paddle.nn.Layer):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = paddle.nn.Linear(4, 3)\n"
        "    def forward(self, x):\n        return self.fc(x.reshape([5, -1]))\n"
        "def paddle_model():\n    return Broken()\n"
        "def inputs():\n    return (np.ones((2, 4), np.float32),)\n")
    r = run_verify("--spec", tmp / "spec.py")
    assert r.code == 2, r
    assert "paddle_model()" in r.stderr and "fails on inputs()" in r.stderr and "Traceback" not in r.stderr


def test_weights_checkpoint_is_loaded_into_the_torch_model_first(tmp):
    import torch
    from converter.spec import load_spec
    spec = load_spec(spec_path("cnn"))
    trained = spec.torch_model()
    with torch.no_grad():
        trained.head.weight.mul_(3.0)  # weights that differ from what torch_model() builds
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(tmp / "trained.safetensors"))
    r = run_verify("--spec", spec_path("cnn"), "--weights", tmp / "trained.safetensors", "--json", tmp / "r.json")
    assert r.code == 0, r
    assert json.loads((tmp / "r.json").read_text())["verdict"] == "pass"
    from converter.compare.session import Options, PortSession
    session = PortSession(spec, Options(device="cpu"), weights=str(tmp / "trained.safetensors"))
    assert torch.equal(session.torch_model.head.weight, trained.head.weight)
    (tmp / "wrong.safetensors").write_bytes((tmp / "trained.safetensors").read_bytes()[:100])
    r = run_verify("--spec", spec_path("cnn"), "--weights", tmp / "wrong.safetensors")
    assert r.code == 2 and "wrong.safetensors" in r.stderr


@pytest.mark.slow


def test_auto_strategy_switches_to_binary_search_when_activations_do_not_fit():
    spec, bug = _planted_bert("gelu-tanh")
    report = verify(spec, Options(device="cpu"), bisect=True, capture_limit=1 << 20)
    assert report.strategy == "binary"
    assert any("switched to the low-memory binary search" in n for n in report.notes)
    assert report.first_bad.torch == bug.culprit


@pytest.mark.slow


def test_captures_running_at_once_share_one_memory_limit():
    """Full capture records torch and paddle at the same time: the limit bounds what both hold
    together, and once it is passed both stop."""
    from converter.examples import bert_port as B
    from converter.verify.full import FullCapture
    from converter.compare.capture import Allowance, CaptureTooLarge, capture_torch
    from converter.compare.session import PortSession
    session = PortSession(spec_from_functions(B.torch_model, B.paddle_model, B.inputs, label="bert"),
                          Options(device="cpu"))
    alone = Allowance()
    capture_torch(session, allowance=alone)
    assert alone.held > 0
    with pytest.raises(CaptureTooLarge):  # either side alone fits, both together do not
        FullCapture(int(alone.held * 1.5)).run(session)
    found = FullCapture(int(alone.held * 2.5)).run(session)
    assert found.first_bad is not None and found.first_bad.within_budget is False  # the bundled port's GELU bug


def test_an_output_naming_the_specs_own_rule_file_is_refused_and_the_file_kept(tmp):
    rules = tmp / "rules.json"
    rules.write_text('{"rules": []}\n')
    (tmp / "spec.py").write_text(f"mapping = {str(rules)!r}\n"
                                 "def torch_model():\n    return None\n"
                                 "def paddle_model():\n    return None\n"
                                 "def inputs():\n    return ()\n")
    r = run_verify("--spec", tmp / "spec.py", "--json", rules, "--force")
    assert r.code == 2 and "is also an input" in r.stderr and "rules.json" in r.stderr, r
    assert rules.read_text() == '{"rules": []}\n'


def test_the_json_report_is_strict_json_when_paddle_gives_nan(tmp):
    (tmp / "nan.py").write_text(
        "import numpy as np, paddle, torch\n"
        "class T(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.inner = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n        return self.inner(x)\n"
        "def torch_model():\n    torch.manual_seed(0)\n    return T()\n"
        "class P(paddle.nn.Layer):\n"
        "    def __init__(self):\n        super().__init__()\n        self.inner = paddle.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n        return self.inner(x) * float('nan')\n"
        "def paddle_model():\n    return P()\n"
        "def inputs():\n    return (np.ones((2, 4), np.float32),)\n"
        "mapping = None\n")
    r = run_verify("--spec", tmp / "nan.py", "--json", tmp / "r.json", "--device", "cpu")
    assert r.code == 1, r

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")
    body = json.loads((tmp / "r.json").read_text(), parse_constant=refuse)
    assert body["verdict"] == "fail" and body["first_bad_layer"]["ratio"] is None, body["first_bad_layer"]
    worst = next(row for row in body["layers"] if row["torch"] == body["first_bad_layer"]["torch"])
    assert worst["within_budget"] is False and worst["nan"] > 0, worst


def test_an_oserror_from_a_library_gets_no_disk_hint(capsys):
    import errno

    from converter.cli.common import one_line_errors

    def fails(exc):
        @one_line_errors
        def run():
            raise exc
        with pytest.raises(SystemExit) as stop:
            run()
        assert stop.value.code == 2
        return capsys.readouterr().err
    kernel = fails(OSError("(Unimplemented) CrossEntropyGradKernel is not implemented for float32"))
    assert "not implemented for float32" in kernel and "disk" not in kernel, kernel
    full = fails(OSError(errno.ENOSPC, "No space left on device", "out.pdparams"))
    assert "No space left on device (out.pdparams)" in full and "free disk space" in full, full


@pytest.mark.parametrize("command,args,words", [
    ("verify-port", ["--strategy", "foo"], "Invalid value for '--strategy': 'foo' is not one of"),
    ("verify-port", ["--rows", "x"], "Invalid value for '--rows': 'x' is not a valid integer"),
    ("verify-port", ["--no-such-option"], "No such option '--no-such-option'"),
    ("verify-port", ["--mapping"], "Option '--mapping' requires an argument"),
    ("convert-weights", ["model.pt"], "Missing argument 'DST'"),
    ("convert-weights", [], "Missing argument 'SRC'"),
    ("convert-weights", ["a", "b", "c"], "Got unexpected extra argument (c)"),
    ("convert-weights", ["a.pt", "b.pdparams", "--dtype"], "Option '--dtype' requires an argument"),
])
def test_a_usage_error_is_one_line_saying_where_help_is(command, args, words):
    from helpers.cli import run_convert
    r = (run_verify if command == "verify-port" else run_convert)(*args)
    assert r.code == 2, r
    assert r.stderr.splitlines() == [r.stderr.rstrip("\n")], r  # one line, no usage block
    assert r.stderr.startswith(f"error: {words}") and f"(see '{command} --help')" in r.stderr, r


def test_a_usage_error_of_the_installed_scripts_is_one_line():
    for command, option in (("verify-port", "--strategy"), ("convert-weights", "--max-shard-size")):
        r = run_script(command, "a.pt", "b.pdparams", option) if command == "convert-weights" else \
            run_script(command, option)
        assert r.code == 2 and r.stdout == "", r
        assert r.stderr == f"error: Option '{option}' requires an argument (see '{command} --help')\n", r
