"""`convert-weights HF_DIR OUT_DIR && verify-port HF_DIR OUT_DIR` on tiny random HF transformers 5
models saved with save_pretrained (2 layers, hidden 64, 4 heads, 2 KV heads, vocab 128) against
PaddleFormers 1.2: the clean pairs (Llama, Qwen2, Qwen3, Phi3, ERNIE 4.5) pass with every loaded
weight equal to torch's; --train passes on Llama; a weight changed in OUT_DIR's file (Llama, Qwen2)
is named at its layer and weight; a directory whose weights the model does not
take, and an architecture PaddleFormers lacks, are one line each. Neither directory is changed.
Runs in the second side environment (scripts/side_env_paddleformers.sh); elsewhere it is skipped."""

import hashlib
import json
import os

import pytest
import torch

from helpers.cli import run_verify
from helpers.directories import converted_pair, directory_with_weights
from hf_paddleformers import transformers

pytest.importorskip("paddleformers")

SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             num_hidden_layers=2, vocab_size=128, tie_word_embeddings=False)
CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "phi3": "Phi3Config",
           "ernie4_5": "Ernie4_5Config"}
EXTRA = {"phi3": {"pad_token_id": 0}}  # HF's Phi3Config says 32000, past this vocabulary
PAIRS = {}  # family -> (HF_DIR, OUT_DIR), made once for the module


def _contents(directory) -> dict:
    """Every file under the directory: its name, and a digest of its bytes."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    def make(family):
        if family not in PAIRS:
            config = getattr(transformers, CONFIGS[family])(**SIZES, **EXTRA.get(family, {}))
            PAIRS[family] = converted_pair(tmp_path_factory.mktemp(family), transformers.AutoModelForCausalLM.from_config,
                                           config)
        return PAIRS[family]
    return make


def _rewritten(out_dir, target, change) -> str:
    """A copy of OUT_DIR beside it whose weights file has `change(weights)` applied, written anew."""
    from converter.io.pdparams import load_pdparams
    weights = load_pdparams(str(out_dir / "model_state.pdparams"))
    change(weights)
    return directory_with_weights(out_dir, out_dir.parent / target, weights)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_converted_directory_passes_against_its_hf_directory(family, pair):
    hf_dir, out_dir = pair(family)
    before = _contents(hf_dir), _contents(out_dir)
    r = run_verify(hf_dir, out_dir, "--device", "cpu", "--json", out_dir.parent / "report.json")
    assert r.code == 0, r
    assert "PASS" in r.stdout and "loaded weights: all" in r.stdout, r.stdout
    plain = {"qwen2": "Qwen2ForCausalLMDeprecated", "qwen3": "Qwen3ForCausalLMDeprecated"}  # without paddlefleet
    cls = plain.get(family, CONFIGS[family].replace("Config", "ForCausalLM"))
    assert f"PaddleFormers 1.2.0's {cls}" in r.stderr and f"rules 'paddleformers-{family}'" in r.stderr, r.stderr
    assert (_contents(hf_dir), _contents(out_dir)) == before  # neither library wrote into the directories
    report = json.loads((out_dir.parent / "report.json").read_text())
    weights = report["loaded_weights"]
    assert weights["mapping"] == f"paddleformers-{family}" and weights["checked"] > 0 and not weights["differ"]
    layers = {row["torch"]: row for row in report["layers"]}
    assert "model.layers.1.mlp.down_proj" in layers and "lm_head" in layers
    if family in ("qwen2", "qwen3", "ernie4_5"):  # paired through the fused q|k|v the directory holds
        assert layers["model.layers.1.self_attn.k_proj"]["paddle"] == "model.layers.1.self_attn.qkv_proj"


@pytest.mark.parametrize("family, key, source, culprit", [
    ("llama", "model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight",
     "model.layers.1.mlp.down_proj"),
    ("qwen2", "model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.self_attn.q_proj.weight",
     "model.layers.1.self_attn.q_proj"),  # element [0, 7]: the first query head of the first KV group
])
def test_one_changed_weight_in_the_directory_is_named(family, key, source, culprit, pair):
    hf_dir, out_dir = pair(family)

    def change(weights):
        w = weights[key].copy()
        w[0, 7] += 0.25
        weights[key] = w
    planted = _rewritten(out_dir, f"planted-{family}", change)
    r = run_verify(hf_dir, planted, "--device", "cpu", "--json", planted.parent / "planted.json")
    assert r.code == 1, r
    report = json.loads((planted.parent / "planted.json").read_text())
    [differ] = report["loaded_weights"]["differ"]
    assert differ["paddle"] == key and source in differ["torch"].split("+"), differ
    assert differ["differ"] == 1 and differ["index"] == [0, 7] and abs(differ["max_abs"] - 0.25) < 1e-6, differ
    assert report["verdict"] == "fail" and report["first_bad_layer"]["torch"] == culprit, report["first_bad_layer"]
    assert key in r.stdout, r.stdout


def test_a_directory_whose_weights_the_model_does_not_take_is_one_line(pair):
    hf_dir, out_dir = pair("llama")

    def rename(weights):
        weights["llama.norm.weight"] = weights.pop("model.norm.weight")
    wrong = _rewritten(out_dir, "renamed", rename)
    r = run_verify(hf_dir, wrong, "--device", "cpu")
    assert r.code == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert "'model.norm.weight' are not there" in lines[-1] and "'llama.norm.weight' are not the model's" in lines[-1]
    assert "Traceback" not in r.stderr


def test_an_architecture_paddleformers_lacks_is_one_line(pair, tmp_path):
    _, out_dir = pair("llama")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_head=2, n_layer=1, vocab_size=64, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    paddle_dir = tmp_path / "paddle"
    paddle_dir.mkdir()
    (paddle_dir / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (paddle_dir / "model_state.pdparams").write_bytes((out_dir / "model_state.pdparams").read_bytes())
    r = run_verify(tmp_path / "gpt2", paddle_dir, "--device", "cpu")
    assert r.code == 2 and r.stdout == "", r
    assert "PaddleFormers 1.2.0 has no 'GPT2LMHeadModel'; write a port spec" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_train_checks_a_causal_lm_directory_with_adamw(pair):
    hf_dir, out_dir = pair("llama")
    report_path = out_dir.parent / "train.json"
    r = run_verify(hf_dir, out_dir, "--device", "cpu", "--train", "--steps", "3", "--json", report_path)
    assert r.code == 0, r
    assert "training checks: causal-LM cross entropy" in r.stderr and "paddle.optimizer.AdamW(" in r.stdout, r
    train = json.loads(report_path.read_text())["train"]
    assert train["verdict"] == "pass" and [p["verdict"] for p in train["phases"]].count("pass") >= 5, train["phases"]
    losses = [s["loss_torch"] for s in train["steps"]]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses  # AdamW trains on the batch


def test_an_hf_directory_whose_weights_its_class_does_not_take_is_one_line(pair, tmp_path):
    """transformers would initialise the missing tensor at random and go on."""
    from safetensors.torch import load_file, save_file
    hf_dir, out_dir = pair("llama")
    lacking = tmp_path / "hf-lacking"
    lacking.mkdir()
    (lacking / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    state = load_file(str(hf_dir / "model.safetensors"))
    del state["model.norm.weight"]
    save_file(state, str(lacking / "model.safetensors"), metadata={"format": "pt"})
    r = run_verify(lacking, out_dir, "--device", "cpu")
    assert r.code == 2 and r.stdout == "", r
    line = r.stderr.strip().splitlines()[-1]
    assert "HF_DIR" in line and "'model.norm.weight' are not there" in line and "Traceback" not in r.stderr, r.stderr
