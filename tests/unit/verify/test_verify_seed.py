"""The seed report reproduced: a LayerNorm, then a square 1536x1536 query_proj."""

import pytest
import json
import sys

import torch

from helpers.cli import SPECS, run_convert, run_verify, spec_path
from converter.spec import load_spec, spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

SEED = spec_path("seed_report")


def _layer(report_json, name):
    return next(layer for layer in report_json["layers"] if layer["torch"] == name)


@pytest.mark.slow


def test_a_fp32_on_both_sides_passes(tmp):
    r = run_verify("--spec", SEED, "--device", "cpu", "--bisect", "--json", tmp / "r.json")
    assert r.code == 0, r
    body = json.loads((tmp / "r.json").read_text())
    assert body["verdict"] == "pass" and body["first_bad_layer"] is None and body["diagnosis"] == []
    q = _layer(body, "query_proj")
    assert q["within_budget"] and q["local_max_abs"] < 1e-5
    assert body["precision"]["paddle"]["effective"] == "fp32"


@pytest.mark.slow


def test_b_emulated_tf32_passes_with_query_proj_difference_about_1e4(tmp):
    r = run_verify("--spec", SEED, "--device", "cpu", "--emulate", "paddle=tf32", "--bisect", "--json", tmp / "r.json")
    assert r.code == 0, r
    body = json.loads((tmp / "r.json").read_text())
    q = _layer(body, "query_proj")
    assert 3e-5 < q["mean_abs"] < 3e-4, q["mean_abs"]  # the report's 1.2e-4
    assert q["within_budget"] and q["budget"] > q["local_max_abs"]
    assert q["formats"]["paddle"] == "tf32"
    assert body["precision"]["paddle"]["emulated"] == "tf32"
    assert "query_proj" in r.stdout and "PASS" in r.stdout


@pytest.mark.slow


def test_c_silent_tf32_fails_at_query_proj_and_names_tf32():
    sys.path.insert(0, SPECS)
    import seed_report as s
    report = verify(spec_from_functions(s.torch_model, s.paddle_model_silent_tf32, s.inputs), Options(device="cpu"),
                    bisect=True)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "query_proj"
    causes = " ".join(d.cause for d in report.diagnosis)
    assert "TF32" in causes, causes
    # a CPU run cannot be in TF32: the diagnosis says the layer rounds its inputs itself
    assert "does not run on this CPU" in causes and "consistent with TF32 on one side" not in causes, causes


@pytest.mark.slow


def test_d_converted_file_with_untransposed_square_weight_fails_at_query_proj(tmp):
    spec = load_spec(SEED)
    torch.save(spec.torch_model().state_dict(), tmp / "m.pt")
    rules = {"name": "forgot-transpose", "rules": [
        {"kind": "rename", "match": r"(norm|query_proj)\.(weight|bias)", "to": r"\1.\2"}]}
    (tmp / "rules.json").write_text(json.dumps(rules))
    assert run_convert(tmp / "m.pt", tmp / "bad.pdparams", "--mapping", tmp / "rules.json").code == 0
    r = run_verify("--spec", SEED, "--device", "cpu", "--converted", tmp / "bad.pdparams", "--bisect",
                   "--json", tmp / "r.json")
    assert r.code == 1, r
    body = json.loads((tmp / "r.json").read_text())
    assert body["first_bad_layer"]["torch"] == "query_proj"
    assert body["first_bad_layer"]["ratio"] > 1
    assert any("untransposed" in d["cause"] for d in body["diagnosis"]), body["diagnosis"]


@pytest.mark.slow


def test_strict_precision_is_recorded(tmp):
    r = run_verify("--spec", SEED, "--device", "cpu", "--precision", "strict", "--json", tmp / "r.json")
    assert r.code == 0, r
    precision = json.loads((tmp / "r.json").read_text())["precision"]
    assert precision["torch"]["flags"]["cudnn.allow_tf32"] is False
    assert precision["torch"]["flags"]["float32_matmul_precision"] == "highest"
    assert precision["torch"]["effective"] == precision["paddle"]["effective"] == "fp32"


@pytest.mark.slow


def test_bf16_emulated_on_the_torch_side_passes_within_a_bf16_budget(tmp):
    r = run_verify("--spec", SEED, "--device", "cpu", "--emulate", "torch=bf16", "--json", tmp / "r.json")
    assert r.code == 0, r
    q = _layer(json.loads((tmp / "r.json").read_text()), "query_proj")
    assert q["formats"]["torch"] == "bf16" and q["within_budget"]
    assert q["local_max_abs"] > 1e-3  # bf16 noise, far above fp32's, yet within its budget
