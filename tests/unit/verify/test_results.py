"""One result model: verdicts (a row never judged is not a pass), reports truthy only when they
pass, diagnoses with a kind, and reports that compose and read back from their JSON."""

import json
import math

import numpy as np
import pytest

from converter.report import PortReport, render_html, render_json, render_text
from converter.results import Verdict, finite_or_null
from converter.verify.report import LayerResult, Report
from helpers.cli import spec_path


def _row(ratio):
    return LayerResult("a", "a", "Linear", "Linear", (2, 3), ratio=ratio)


def test_a_verdict_is_truthy_only_when_it_passes():
    assert Verdict.of_ratio(None) is Verdict.NOT_JUDGED and not Verdict.NOT_JUDGED
    assert Verdict.of_ratio(0.5) is Verdict.PASS and Verdict.PASS
    assert Verdict.of_ratio(1.0) is Verdict.PASS
    assert Verdict.of_ratio(1.5) is Verdict.FAIL and not Verdict.FAIL
    assert Verdict.of_ratio(float("nan")) is Verdict.FAIL and Verdict.of_ratio(float("inf")) is Verdict.FAIL
    assert Verdict.of_all([Verdict.PASS, Verdict.NOT_JUDGED]) is Verdict.PASS
    assert Verdict.of_all([Verdict.PASS, Verdict.FAIL]) is Verdict.FAIL
    assert Verdict.FAIL == "fail" and json.dumps(Verdict.PASS) == '"pass"'


def test_a_row_never_judged_is_not_a_pass():
    unjudged, within, over = _row(None), _row(0.25), _row(3.0)
    assert not unjudged and unjudged.verdict is Verdict.NOT_JUDGED and unjudged.within_budget is None
    assert within and within.within_budget is True
    assert not over and over.within_budget is False
    precision = {"torch": {"effective": "fp32"}, "paddle": {"effective": "fp32"}}
    failing = Report([within, over], over, precision, [], "full", 2)
    passing = Report([within, unjudged], None, precision, [], "full", 2)
    assert not failing and failing.verdict is Verdict.FAIL and failing.exit_code == 1
    assert passing and passing.verdict is Verdict.PASS and passing.exit_code == 0
    assert PortReport(passing) and not PortReport(failing)


def test_finite_or_null_nulls_every_nan_and_infinity_inside():
    value = {"a": [np.float32(1.5), np.float64("nan"), float("-inf")], "b": (3, True, "x"), "c": None}
    assert finite_or_null(value) == {"a": [1.5, None, None], "b": [3, True, "x"], "c": None}
    assert type(finite_or_null(np.float64(2.0))) is float


def _read_back(report: PortReport) -> PortReport:
    return PortReport.from_json(json.loads(render_json(report)))


def _same_renderings(report: PortReport, back: PortReport):
    assert render_json(back) == render_json(report)
    assert render_text(back, max_rows=1000) == render_text(report, max_rows=1000)
    assert render_html(back) == render_html(report)
    assert back.verdict is report.verdict and bool(back) == bool(report) and back.exit_code == report.exit_code


@pytest.fixture(scope="module")
def forward():
    from converter import PortSpec, VerifyOptions, verify_port
    from converter.examples import bert_port
    return verify_port(PortSpec.from_file(bert_port.__file__), VerifyOptions(device="cpu", bisect=True))


@pytest.mark.slow
def test_a_failing_forward_report_reads_back_from_its_json(forward):
    assert not forward and forward.forward.first_bad is not None and forward.train is None
    back = _read_back(forward)
    _same_renderings(forward, back)
    first = back.forward.first_bad
    assert first is not None and first in back.forward.layers and first.verdict is Verdict.FAIL
    assert first.torch == forward.forward.first_bad.torch
    assert [d.cause for d in back.forward.diagnosis] == [d.cause for d in forward.forward.diagnosis]


@pytest.mark.slow
def test_a_diagnosis_carries_the_kind_its_check_gave(forward):
    kinds = [d.kind for d in forward.forward.diagnosis]
    assert kinds and all(kinds), forward.forward.diagnosis
    gelu = [d for d in forward.forward.diagnosis if d.cause.startswith("GELU variant")]
    assert gelu and all(d.kind == "activation" for d in gelu)


@pytest.mark.slow
def test_a_binary_search_report_reads_back_from_its_json():
    from converter import PortSpec, VerifyOptions, verify_port
    from converter.examples import bert_port
    report = verify_port(PortSpec.from_file(bert_port.__file__),
                         VerifyOptions(device="cpu", strategy="binary", bisect=True))
    assert report.forward.strategy == "binary" and not report
    back = _read_back(report)
    _same_renderings(report, back)
    assert back.forward.first_bad.torch == report.forward.first_bad.torch


@pytest.mark.slow
def test_a_failing_training_report_composes_and_reads_back():
    from converter import PortSpec, VerifyOptions, verify_port
    import paddle
    module = PortSpec.from_file(spec_path("train_mlp")).module
    spec = PortSpec(module.torch_model, module.paddle_model, module.inputs, batches=module.batches(),
                    torch_loss=module.torch_loss, torch_optimizer=module.torch_optimizer,
                    paddle_loss=lambda o, t: paddle.nn.functional.cross_entropy(o, t, reduction="sum"))
    report = verify_port(spec, VerifyOptions(device="cpu", train=True, steps=2))
    assert report.forward and not report.train and not report and report.exit_code == 1
    assert report.train.first_bad is not None and report.train.first_bad.phase == "loss"
    assert report.train.diagnosis[0].kind == "cross entropy" and "reduction" in report.train.diagnosis[0].cause
    back = _read_back(report)
    _same_renderings(report, back)
    assert back.train.first_bad in back.train.rows and back.train.first_bad.bad
    assert [s.loss_paddle for s in back.train.steps] == [s.loss_paddle for s in report.train.steps]


def test_a_ratio_over_every_budget_reads_back_as_a_failure():
    over = _row(float("inf"))
    precision = {"torch": {"effective": "fp32"}, "paddle": {"effective": "fp32"}}
    report = PortReport(Report([_row(0.5), over], over, precision, [], "full", 2))
    body = json.loads(render_json(report))
    assert body["layers"][1]["ratio"] is None and body["layers"][1]["within_budget"] is False
    back = PortReport.from_json(body)
    assert math.isinf(back.forward.first_bad.ratio) and back.forward.first_bad is back.forward.layers[1]
    _same_renderings(report, back)


def test_both_strategies_declare_one_interface():
    from converter.verify.full import FullCapture, Strategy, StrategyResult
    from converter.verify.strategies import BinarySearch, ChunkedCapture
    import inspect
    for strategy in (FullCapture(1 << 30), BinarySearch(1 << 30), ChunkedCapture(1 << 30)):
        assert isinstance(strategy.name, str)
        assert inspect.signature(type(strategy).run).return_annotation in (StrategyResult, "StrategyResult")
    assert "run" in Strategy.__dict__
