"""verify-port --train has one verdict: the text's last line, the JSON's top-level `verdict`, the
HTML heading and the exit code are the composed verdict of the forward and the training checks; the
forward check's own verdict is labelled as its own."""

import html
import json

import pytest

from converter.report import PortReport
from helpers.cli import run_verify, spec_path

# train_mlp's pair with a clean forward, and paddle's AdamW at another learning rate than torch's
LR_BUG = """

def torch_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)


def paddle_optimizer(model):
    return paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.05)
"""


def _run(tmp, spec, *extra):
    out, page = tmp / "r.json", tmp / "r.html"
    r = run_verify("--spec", spec, "--train", "--steps", 2, "--device", "cpu", "--json", out, "--html", page, *extra)
    return r, json.loads(out.read_text()), page.read_text()


def test_a_failing_training_check_fails_the_text_json_and_html_whose_forward_check_passes(tmp):
    spec = tmp / "lr_bug.py"
    spec.write_text(open(spec_path("train_mlp")).read() + LR_BUG)
    r, body, page = _run(tmp, spec)
    assert r.code == 1, r
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith("FAIL: the training checks fail (first over budget: learning rate at step 0"), lines[-1]
    assert lines[-1].endswith("the forward check passes"), lines[-1]
    assert "forward check: PASS: all 5 compared layers are within their expected-error budget" in lines
    assert not any(line.startswith("PASS") for line in lines)
    assert body["verdict"] == "fail" and body["forward_verdict"] == "pass" and body["train"]["verdict"] == "fail"
    assert PortReport.from_json(body).verdict == "fail" and PortReport.from_json(body).exit_code == 1
    assert '<h1>verify-port: FAIL</h1><section id="verdict"><p class="verdict verdict-fail"><b>FAIL: the training checks fail' in page
    assert "forward check: PASS: all 5 compared layers" in page


@pytest.mark.slow
def test_a_clean_pair_ends_with_the_composed_pass(tmp):
    r, body, page = _run(tmp, spec_path("train_mlp"))
    assert r.code == 0, r
    last = r.stdout.strip().splitlines()[-1]
    assert last == ("PASS: the training checks (2 step(s)) and the forward check (5 compared layers) are within "
                    "their expected-error budgets"), last
    assert "forward check: PASS: all 5 compared layers" in r.stdout
    assert body["verdict"] == body["forward_verdict"] == body["train"]["verdict"] == "pass"
    assert '<h1>verify-port: PASS</h1><section id="verdict"><p class="verdict verdict-pass"><b>PASS: the training checks' in page


def test_without_train_the_forward_verdict_is_the_verdict(tmp):
    out = tmp / "r.json"
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--json", out)
    body = json.loads(out.read_text())
    assert r.code == 0, r
    assert r.stdout.strip().splitlines()[-1] == "PASS: all 5 compared layers are within their expected-error budget"
    assert body["verdict"] == body["forward_verdict"] == "pass" and "train" not in body


def _composed(forward_bad: bool, train_bad: bool) -> PortReport:
    from converter.train.result import Row, TrainReport
    from converter.verify.report import LayerResult, Report
    rows = [LayerResult("fc", "fc", "Linear", "Linear", (2, 3), 1e-6, local_max_abs=1e-6, budget=1e-5 if not forward_bad
                        else 1e-7, ratio=0.1 if not forward_bad else 10.0)]
    precision = {"torch": {"effective": "fp32"}, "paddle": {"effective": "fp32"}}
    forward = Report(rows, rows[0] if forward_bad else None, precision, [], "full", 2)
    bad = Row("optimizer", 0, "fc.weight", "fc.weight", 3.0) if train_bad else None
    return PortReport(forward, TrainReport([bad] if bad else [], [], bad))


@pytest.mark.parametrize("forward_bad, train_bad", [(True, False), (True, True), (False, True), (False, False)])
def test_the_last_line_names_each_check_that_failed(forward_bad, train_bad):
    from converter.report import render_html, verdict_line
    report = _composed(forward_bad, train_bad)
    line = verdict_line(report)
    assert line.startswith("FAIL: " if forward_bad or train_bad else "PASS: "), line
    assert report.to_json()["verdict"] == ("fail" if forward_bad or train_bad else "pass")
    assert report.to_json()["forward_verdict"] == ("fail" if forward_bad else "pass")
    assert ("the forward check fails (first layer over budget: fc (Linear)" in line) == forward_bad, line
    assert ("the training checks fail (first over budget: optimizer (teacher-forced) at step 0, torch 'fc.weight'"
            in line) == train_bad, line
    assert line.endswith("the forward check passes") == (train_bad and not forward_bad), line
    assert line.endswith("the training checks pass") == (forward_bad and not train_bad), line
    page = render_html(report)  # the page leads with the same line, before any section
    assert f"<b>{html.escape(line)}</b></p>" in page
    assert page.index(html.escape(line)) < page.index("<h2>")
