"""A PASS that explains: the seed's case (a 1536x1536 query_proj, TF32 on paddle's side, fp32 on
torch's) prints in one paragraph why its layer differs by about 1e-4 (TF32's rounding, with each
side's error against float64), what the same layer gives with both sides in fp32 (measured here
again, independently) and how to turn TF32 off on each side; --threshold says where a fixed
tolerance cannot hold under that arithmetic and whether the run's errors are within it."""

import json
import re
import sys

import numpy as np
import pytest

from helpers.cli import SPECS, run_verify, spec_path
from converter.api import OptionError, PortSpec, VerifyOptions, verify_port
from converter.report import PortReport, render_json

SEED = spec_path("seed_report")
pytestmark = pytest.mark.slow


def _paragraph(stdout: str) -> str:
    """The indented lines under the precision line, joined: the report's explanation."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("precision:"))
    said = []
    for line in lines[at + 1:]:
        if not line.startswith("  "):
            break
        said.append(line.strip())
    return " ".join(said)


def _fp32_query_proj_difference() -> float:
    """query_proj's output from both frameworks in fp32 on the same input (torch's LayerNorm
    output), with torch's weights given to paddle's Linear: measured here without the tool."""
    import paddle
    import torch
    sys.path.insert(0, SPECS)
    import seed_report as s
    t = s.torch_model().eval()
    p = s.PaddleBlock()
    p.query_proj.weight.set_value(t.query_proj.weight.detach().numpy().T)
    p.query_proj.bias.set_value(t.query_proj.bias.detach().numpy())
    with torch.no_grad():
        h = t.norm(torch.from_numpy(s.inputs()[0]))
        y_t = t.query_proj(h).numpy()
    y_p = p.query_proj(paddle.to_tensor(h.numpy())).numpy()
    return float(np.abs(y_p.astype(np.float64) - y_t).max())


def test_the_seed_pass_explains_tf32_with_its_numbers_the_fp32_figure_and_how_to_turn_it_off(tmp):
    r = run_verify("--spec", SEED, "--device", "cpu", "--emulate", "paddle=tf32", "--json", tmp / "r.json")
    assert r.code == 0 and "PASS" in r.stdout.splitlines()[-1], r
    body = json.loads((tmp / "r.json").read_text())
    q = next(row for row in body["layers"] if row["torch"] == "query_proj")
    item = body["explanation"]["items"][0]
    assert item["name"] == "query_proj (Linear)" and item["difference"] == q["local_max_abs"]
    assert 3e-5 < q["local_mean_abs"] < 3e-4  # the report's 1.2e-4
    # paddle's output is as far from float64 as the two sides are apart; torch's far closer
    assert item["own_error"]["paddle"] == pytest.approx(q["local_max_abs"], rel=0.05)
    assert item["own_error"]["torch"] < q["local_max_abs"] / 100
    assert item["budget_terms"][0][:2] == ["input rounding", "paddle"] and item["budget_terms"][0][2] > 0.9
    # with both sides in fp32, the same layer on the same input: what this test measures without the tool
    assert item["fp32"] == pytest.approx(_fp32_query_proj_difference(), rel=1e-6, abs=1e-12)
    assert item["fp32"] < q["local_max_abs"] / 100
    said = _paragraph(r.stdout)
    number = lambda x: f"{x:.1e}"
    for words in ("TF32", "--emulate paddle=tf32", "query_proj (Linear)", number(q["local_max_abs"]),
                  number(q["local_mean_abs"]), number(item["own_error"]["torch"]), number(item["own_error"]["paddle"]),
                  "rounding of products' inputs to TF32", f"in fp32 the same layer differs by {number(item['fp32'])}",
                  "torch.backends.cuda.matmul.allow_tf32 = False", 'torch.set_float32_matmul_precision("highest")',
                  "FLAGS_cublas_allow_tf32=0", "FLAGS_use_accuracy_compatible_kernel=1", "NVIDIA_TF32_OVERRIDE=0"):
        assert words in said, (words, said)
    assert said == body["explanation"]["text"]  # one paragraph, the JSON's too


def test_a_threshold_is_answered_where_the_arithmetic_cannot_hold_it_and_whether_the_errors_are_within(tmp):
    r = run_verify("--spec", SEED, "--device", "cpu", "--emulate", "paddle=tf32", "--threshold", "1e-5",
                   "--json", tmp / "r.json")
    assert r.code == 0, r  # a threshold changes no verdict
    body = json.loads((tmp / "r.json").read_text())
    e = body["explanation"]
    judged = [row for row in body["layers"] if row["ratio"] is not None]
    over = {f"{row['torch'] or '<model>'} ({row['type']})" for row in judged if row["budget"] > 1e-5}
    assert {c["name"] for c in e["cannot_hold"]} == over | {"the final outputs"}
    assert "query_proj (Linear)" in over and "norm (LayerNorm)" not in over
    differ = {f"{row['torch'] or '<model>'} ({row['type']})" for row in judged if row["local_max_abs"] > 1e-5}
    assert {x["name"] for x in e["exceeded"]} == differ | {"the final outputs"}
    said = _paragraph(r.stdout)
    assert e["threshold_text"] in said
    assert re.search(r"--threshold 1e-05 cannot hold .* query_proj \(Linear\) \(budget [0-9.e-]+\)", said), said
    assert "With every side in fp32 it could at query_proj (Linear)" in said
    assert "The run's errors are not within 1e-05: query_proj (Linear) by" in said


def test_a_threshold_the_fp32_arithmetic_holds_is_said_to_hold_and_the_explanation_reads_back(tmp):
    report = verify_port(PortSpec.from_file(SEED), VerifyOptions(device="cpu", threshold=1e-3))
    e = report.forward.explanation
    assert report.verdict == "pass" and e.threshold == 1e-3 and not e.cannot_hold and not e.exceeded
    assert "can hold at every row" in e.threshold_words() and "are within 0.001 at every row" in e.threshold_words()
    assert e.paragraph().startswith("Both sides compute in fp32.") and not e.settings
    q = e.items[0]
    assert q.fp32 is None and q.own["torch"] > 0 and q.own["paddle"] > 0  # fp32 already: nothing re-run
    back = PortReport.from_json(json.loads(render_json(report)))
    assert back.forward.explanation == e
    assert back.forward.layers == report.forward.layers  # the rows' terms and own errors read back too


@pytest.mark.parametrize("value", ["0", "-1e-5", "abc", "nan", "inf"])
def test_a_threshold_that_is_not_a_positive_number_is_refused_in_one_line(value):
    r = run_verify("--spec", SEED, "--device", "cpu", "--threshold", value)
    assert r.code == 2 and "--threshold takes a tolerance above 0" in r.stderr and len(r.stderr.splitlines()) == 1, r
    with pytest.raises(OptionError):
        VerifyOptions(threshold=float(value) if value != "abc" else value)


def test_fp32_arithmetic_puts_the_tf32_switches_back():
    import torch
    from converter.compare.precision import fp32_arithmetic, paddle_precision
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with fp32_arithmetic():
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    assert "FLAGS_use_accuracy_compatible_kernel" in paddle_precision("cpu").flags


def test_an_fp32_figure_that_could_not_be_measured_is_said_so():
    from converter.verify.explanation import Explanation, Item
    item = Item("pool (MaxPool2d)", 1e-4, 1e-5, 2e-4, {"torch": 1e-7, "paddle": 1e-4}, (("input rounding", "paddle", 1.0),),
                fp32_note="not measured (paddle's layer does not run on torch's inputs: TypeError)")
    said = Explanation({"torch": "fp32", "paddle": "tf32"}, {}, (item,)).paragraph()
    assert "with every side in fp32, not measured (paddle's layer does not run on torch's inputs: TypeError)" in said
    assert "At pool (MaxPool2d) the two sides differ by up to 1.0e-04 (mean 1.0e-05) on the same inputs" in said
