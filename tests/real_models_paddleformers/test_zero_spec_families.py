"""`convert-weights HF_DIR OUT_DIR && verify-port HF_DIR OUT_DIR`, with no spec, --mapping or --target,
for every shipped PaddleFormers 1.2 family, on tiny random HF transformers 5 models saved with
save_pretrained (the sizes and fields of test_rule_sets.py): each passes, with every loaded weight
equal to torch's, but the two families with known upstream divergences, each named in one line:

* Gemma 3 with HF's own rotary bases per layer type (1e6 full, 1e4 sliding): PaddleFormers 1.2
  builds one rotary table for every layer. convert-weights refuses the config in one line naming
  that; with --force, verify-port names `model.rotary_emb` with that cause. With one base for both
  layer types Gemma 3 passes.
* GPT-OSS: PaddleFormers' experts in eval mode give tokens other tokens' routing weights;
  verify-port names the experts with that cause.

The classes PaddleFormers builds with paddlefleet are taken in their plain-paddle form, imported with
stand-ins for paddlefleet's GPT provider and paddlefleet_ops where those are not installed, and a
fresh process's description of the class says so; a class that imports paddlefleet itself is refused
in one line naming it. Runs in the second side environment (scripts/side_env_paddleformers.sh)."""

import importlib.util
import json
import os
import sys

import pytest

from helpers.cli import run_convert, run_script, run_verify
from hf_paddleformers import transformers
from test_rule_sets import FAMILIES, MOE, SIZES

from converter.rules.detect import PREFIX, shipped_for

SHIPPED = sorted(name[len(PREFIX):] for name in shipped_for("paddleformers"))
ONE_BASE = {"rope_type": "default", "rope_theta": 10000.0}
# a window of 8: longer than the 5 padded positions of verify-port's second row, shorter than its 16 tokens
GEMMA3 = {"tie_word_embeddings": True, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
CASES = {family: (FAMILIES[family][0], FAMILIES[family][1]) for family in FAMILIES}
CASES["gemma3_text"] = ("Gemma3TextConfig", {**GEMMA3, "rope_parameters": {"full_attention": ONE_BASE,
                                                                           "sliding_attention": ONE_BASE}})
CASES["gemma3_text-two-bases"] = ("Gemma3TextConfig", GEMMA3)  # HF's defaults: 1e6 full, 1e4 sliding
PAIRS = {}  # case -> HF_DIR, saved once for the module


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    def make(case):
        if case not in PAIRS:
            import torch
            config_class, fields = CASES[case]
            torch.manual_seed(0)
            config = getattr(transformers, config_class)(**{**SIZES, **fields})
            eager = {"experts_implementation": "eager"} if case in MOE else {}
            PAIRS[case] = tmp_path_factory.mktemp(case) / "hf"
            transformers.AutoModelForCausalLM.from_config(config, **eager).eval().save_pretrained(PAIRS[case])
        return PAIRS[case]
    return make


def _converted(hf, *args):
    out = hf.parent / "out"
    r = run_convert(hf, out, *args)
    return r, out


def test_every_shipped_paddleformers_family_has_a_case():
    assert len(SHIPPED) == 11 and set(SHIPPED) <= set(CASES), sorted(set(SHIPPED) - set(CASES))


@pytest.mark.parametrize("family", [f for f in SHIPPED if f != "gpt_oss"])
def test_the_family_converts_and_verifies_with_no_spec(family, hf_dir):
    hf = hf_dir(family)
    r, out = _converted(hf)
    assert r.code == 0 and f"'paddleformers-{family}' for PaddleFormers 1.2" in r.stderr, r
    report_path = hf.parent / "report.json"
    r = run_verify(hf, out, "--device", "cpu", "--json", report_path)
    assert r.code == 0 and "PASS" in r.stdout, r
    assert f"rules 'paddleformers-{family}'" in r.stderr and "PaddleFormers 1.2.0's" in r.stderr, r.stderr
    report = json.loads(report_path.read_text())
    weights = report["loaded_weights"]
    assert weights["checked"] > 0 and not weights["differ"] and f"loaded weights: all {weights['checked']}" in r.stdout
    assert report["verdict"] == "pass" and report["outputs"]["ratio"] < 1, report["outputs"]


def test_gpt_oss_is_named_at_its_experts_with_the_upstream_divergence(hf_dir):
    hf = hf_dir("gpt_oss")
    r, out = _converted(hf)
    assert r.code == 0, r
    report_path = hf.parent / "report.json"
    r = run_verify(hf, out, "--device", "cpu", "--bisect", "--json", report_path)
    assert r.code == 1, r
    report = json.loads(report_path.read_text())
    assert not report["loaded_weights"]["differ"], report["loaded_weights"]  # the conversion is not the cause
    assert report["first_bad_layer"]["torch"] == "model.layers.0.mlp.experts", report["first_bad_layer"]
    [cause] = [line for line in r.stdout.splitlines() if line.strip().startswith("cause:")]
    assert "the routing weights are applied to other tokens" in cause, r.stdout


def test_gemma3_with_a_rotary_base_per_layer_type_is_refused_in_one_line_naming_the_divergence(hf_dir):
    hf = hf_dir("gemma3_text-two-bases")
    r, _ = _converted(hf)
    assert r.code == 2 and r.stdout == "", r
    [line] = r.stderr.strip().splitlines()
    assert "'rope_parameters' differ per layer type" in line, line
    assert "PaddleFormers 1.2 builds one rotary table and applies it to every layer" in line and "--force" in line, line


def test_gemma3_with_a_rotary_base_per_layer_type_converted_anyway_is_named_at_its_rotary_table(hf_dir):
    hf = hf_dir("gemma3_text-two-bases")
    r, out = _converted(hf, "--force")
    assert r.code == 0, r
    report_path = hf.parent / "forced.json"
    r = run_verify(hf, out, "--device", "cpu", "--bisect", "--json", report_path)
    assert r.code == 1, r
    report = json.loads(report_path.read_text())
    assert not report["loaded_weights"]["differ"] and report["first_bad_layer"]["torch"] == "model.rotary_emb", report
    [cause] = [line for line in r.stdout.splitlines() if line.strip().startswith("cause:")]
    assert "the sliding_attention rotary table is built with the full_attention layers' rope parameters" in cause, cause


@pytest.mark.skipif(importlib.util.find_spec("paddlefleet") is not None, reason="paddlefleet is installed here")
@pytest.mark.parametrize("family, cls, notes", [
    ("qwen3_moe", "Qwen3MoeForCausalLMDeprecated", ["its Qwen3MoeForCausalLM is built by paddlefleet, which is not "
                                                    "installed", "stand-in for paddlefleet's GPT provider",
                                                    "paddlefleet_ops is not installed: a stand-in that says DeepEP "
                                                    "is not available"]),
    ("deepseek_v3", "DeepseekV3ForCausalLM", ["paddlefleet_ops is not installed: a stand-in that says DeepEP is "
                                              "not available"]),
    ("llama", "LlamaForCausalLM", []),
])
def test_a_fresh_process_names_the_stand_ins_the_class_was_imported_with(family, cls, notes, hf_dir):
    hf = hf_dir(family)
    out = hf.parent / "out"
    if not out.exists():
        assert _converted(hf)[0].code == 0
    verify_port = os.path.join(os.path.dirname(sys.executable), "verify-port")
    r = run_script(verify_port, hf, out, "--device", "cpu")
    assert r.code == 0, r
    [line] = [line for line in r.stderr.splitlines() if line.startswith("torch: transformers")]
    said = line.partition(f"PaddleFormers 1.2.0's {cls}")[2].partition(f" from '{out}'")[0]
    assert all(note in said for note in notes), line
    assert said.count(";") == len(notes) - 1 if notes else said == "", line  # no note the class's import did not need


def test_a_class_that_imports_paddlefleet_itself_is_refused_in_one_line():
    """PaddleFormers 1.2's MiniMax-M2 has no plain-paddle class: its modeling file imports paddlefleet."""
    from converter.errors import UserError
    from converter.hf.classes import paddle_class_of
    if importlib.util.find_spec("paddlefleet") is not None:
        pytest.skip("paddlefleet is installed here")
    with pytest.raises(UserError) as raised:
        paddle_class_of("MiniMaxM2ForCausalLM")
    assert raised.value.message.startswith("PaddleFormers' 'MiniMaxM2ForCausalLM' cannot be imported: it imports "
                                           "'paddlefleet', which is not installed; install it"), raised.value.message
    assert "\n" not in raised.value.message
