"""verify-port --train on clean torch/paddle pairs: every phase within budget over 20 steps, the
report as the README describes it."""

import json

import pytest

from helpers.cli import run_verify, spec_path

STEPS = 20


def _train(tmp, name, *extra):
    out = tmp / "report.json"
    r = run_verify("--spec", spec_path(name), "--train", "--steps", STEPS, "--device", "cpu", "--json", out, *extra)
    return r, json.loads(out.read_text())["train"] if out.exists() else None


@pytest.mark.parametrize("name", ["train_mlp", "train_cnn", "train_transformer", "train_lstm"])
@pytest.mark.slow
def test_clean_pair_passes_every_phase(tmp, name):
    r, train = _train(tmp, name)
    assert r.code == 0, r
    assert train["verdict"] == "pass" and train["first_bad"] is None
    assert len(train["steps"]) == STEPS
    phases = {c["phase"] for c in train["checks"]}
    assert {"loss", "backward", "lr", "optimizer", "steps"} <= phases
    assert all(c["ratio"] <= 1 for c in train["checks"])
    for s in train["steps"]:
        assert abs(s["loss_paddle"] - s["loss_torch"]) <= s["band"] and s["lr_paddle"] == pytest.approx(s["lr_torch"])
    assert any("dropout set to 0" in n for n in train["notes"])
    assert "training verdict: PASS" in r.stdout


@pytest.mark.slow


def test_report_files_and_emitted_optimizer(tmp):
    page, code = tmp / "r.html", tmp / "opt.py"
    r, train = _train(tmp, "train_mlp", "--html", page, "--emit-optimizer", code)
    assert r.code == 0, r
    text = page.read_text()
    assert "Training checks: PASS" in text and text.count("<svg") >= 3  # the forward plot and both loss plots
    namespace = {}
    exec(compile(code.read_text(), str(code), "exec"), namespace)
    from converter.lazy import import_paddle
    opt, sched = namespace["paddle_optimizer"](import_paddle().nn.Linear(2, 2))
    assert type(opt).__name__ == "AdamW" and type(sched).__name__ == "LinearWarmup"
    assert train["optimizer"].startswith("translated from torch's: paddle.optimizer.AdamW(")


def test_emit_optimizer_without_train_is_bad_input(tmp):
    r = run_verify("--spec", spec_path("train_mlp"), "--emit-optimizer", tmp / "o.py")
    assert r.code == 2 and "add --train" in r.stderr and not (tmp / "o.py").exists()


def test_bad_training_input_is_one_line_and_exit_2(tmp):
    r = run_verify("--spec", spec_path("train_mlp"), "--train", "--steps", 0, "--device", "cpu")
    assert r.code == 2 and "--steps takes 1 to 10000 steps" in r.stderr and "Traceback" not in r.stderr
    spec = tmp / "bad_batches.py"
    spec.write_text("import numpy as np, torch, paddle\n"
                    "def torch_model(): return torch.nn.Linear(3, 2)\n"
                    "def paddle_model(): return paddle.nn.Linear(3, 2)\n"
                    "def inputs(): return (np.zeros((2, 3), np.float32),)\n"
                    "def batches(): return [np.zeros(3)]\n")
    r = run_verify("--spec", spec, "--train", "--device", "cpu", "--json", tmp / "r.json")
    assert r.code == 2 and "batches()[0] must be a pair (inputs, target)" in r.stderr
    assert not (tmp / "r.json").exists()


@pytest.mark.slow


def test_failing_report_has_the_issue_fields_and_a_verdict_on_every_row(tmp):
    """The train section of --json holds the fields verify-port --train promises, each row of
    `steps` and `checks` with its verdict; the HTML both loss curves and the band."""
    spec = tmp / "bn_momentum.py"
    spec.write_text(open(spec_path("train_cnn")).read() + "\n\ndef paddle_model():\n    return PaddleCNN(momentum=0.1)\n")
    out, page = tmp / "r.json", tmp / "r.html"
    r = run_verify("--spec", spec, "--train", "--steps", 6, "--device", "cpu", "--json", out, "--html", page)
    assert r.code == 1, r
    train = json.loads(out.read_text())["train"]
    assert {"verdict", "first_bad", "steps", "diagnosis"} <= set(train) and train["verdict"] == "fail"
    assert set(train["first_bad"]) == {"phase", "torch", "paddle", "step", "ratio"}
    assert train["first_bad"]["phase"] == "steps" and train["first_bad"]["paddle"].startswith("bn._")
    assert [s["step"] for s in train["steps"]] == list(range(6))
    for s in train["steps"]:
        assert set(s) == {"step", "loss_torch", "loss_paddle", "lr_torch", "lr_paddle", "band", "verdict"}
        within = abs(s["loss_paddle"] - s["loss_torch"]) <= s["band"] and s["lr_paddle"] == pytest.approx(s["lr_torch"])
        assert s["verdict"] == ("pass" if within else "fail")
    assert train["diagnosis"] and all(set(d) == {"layer", "kind", "cause", "hint"} for d in train["diagnosis"])
    assert all(c["verdict"] == ("fail" if c["ratio"] > 1 else "pass") for c in train["checks"] if c["ratio"] is not None)
    assert any(c["verdict"] == "fail" and c["paddle"] == train["first_bad"]["paddle"] for c in train["checks"])
    text = page.read_text()
    assert "Training checks: FAIL" in text and "torch (solid), paddle (dashed), band around torch (shaded)" in text
    section = text[text.index("Training checks: FAIL"):]
    assert section.count("<polyline") >= 4 and section.count("<polygon") == 1  # two curves, the band, the gap plot


def _strict(text):
    def refuse(token):
        raise ValueError(f"{token} is no JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow


def test_nan_and_infinite_values_are_null_in_strict_json_with_their_verdicts(tmp):
    """A paddle loss that is NaN on every step: the train section is strict JSON (Python wrote NaN
    and Infinity, which JSON parsers refuse); the values are null and the verdicts say fail."""
    spec = tmp / "nan_loss.py"
    spec.write_text(open(spec_path("train_mlp")).read() + "\n\ndef paddle_loss(output, target):\n"
                    "    return paddle.nn.functional.cross_entropy(output, target) * float('nan')\n")
    out = tmp / "r.json"
    r = run_verify("--spec", spec, "--train", "--steps", 3, "--device", "cpu", "--json", out)
    assert r.code == 1, r
    train = _strict(out.read_text())["train"]
    assert train["first_bad"]["phase"] == "loss" and train["first_bad"]["ratio"] is None
    assert all(s["loss_paddle"] is None and s["verdict"] == "fail" for s in train["steps"])
    assert any(c["ratio"] is None and c["verdict"] == "fail" for c in train["checks"])


def test_a_gradient_in_another_shape_is_compared_and_said_so():
    """No silent reshape: paddle's value with torch's elements in another shape is compared in
    torch's shape with a note naming both shapes; another element count is a shape mismatch."""
    import numpy as np

    from converter.train.judge import judge
    want = np.arange(6, dtype=np.float32).reshape(2, 3)
    row = judge("backward", 0, "x", "x", want, want.reshape(3, 2), np.full_like(want, 1e-7))
    assert row.ratio == 0 and row.note == "paddle's [3, 2] compared as torch's [2, 3]"
    row = judge("backward", 0, "x", "x", want, np.zeros(4, np.float32), np.zeros_like(want))
    assert row.bad and row.note == "shapes differ: torch [2, 3], paddle [4]"


SHARED = '''
import numpy as np, paddle, torch


class TorchShared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.mid, self.fc2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.mid(torch.tanh(self.mid(torch.tanh(self.fc1(x)))))))


class PaddleShared(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1, self.mid, self.fc2 = paddle.nn.Linear(6, 8), paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(paddle.tanh(self.mid(paddle.tanh(self.mid(paddle.tanh(self.fc1(x)))))))


def torch_model():
    torch.manual_seed(0)
    return TorchShared()


def paddle_model():
    return PaddleShared()


def inputs():
    return (np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32),)
'''


def test_a_layer_called_twice_is_said_to_be_left_out_of_the_per_layer_backward(tmp):
    spec = tmp / "shared.py"
    spec.write_text(SHARED)
    out = tmp / "r.json"
    r = run_verify("--spec", spec, "--train", "--steps", 3, "--device", "cpu", "--json", out)
    assert r.code == 0, r
    checks = json.loads(out.read_text())["train"]["checks"]
    left = [c for c in checks if c["verdict"] == "not compared"]
    assert [(c["torch"], c["paddle"]) for c in left] == [("mid", "mid")] and "called 2 times" in left[0]["note"]
    assert any(c["paddle"] == "mid.weight" and "end-to-end" in c["note"] for c in checks)
