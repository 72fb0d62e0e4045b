"""`convert-weights HF_DIR OUT_DIR && verify-port HF_DIR OUT_DIR` on tiny random HF transformers 4
BERT directories (a BertModel and a BertForSequenceClassification, saved with save_pretrained)
against PaddleNLP 2.8.1: the clean pairs pass with every loaded weight equal to torch's and
neither directory changed; a weight changed in OUT_DIR's file is named at its tensor and layer.
Runs only where transformers and PaddleNLP are installed (scripts/side_env.sh); elsewhere it is
skipped."""

import hashlib
import json
import os

import pytest

from helpers.cli import run_verify
from helpers.directories import converted_pair, directory_with_weights

transformers = pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

SIZES = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=2, vocab_size=100,
             max_position_embeddings=64)
CLASSES = {"BertModel": {}, "BertForSequenceClassification": {"num_labels": 3}}


def _contents(directory) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return {name: converted_pair(tmp_path_factory.mktemp(name), getattr(transformers, name),
                                 transformers.BertConfig(**SIZES, **extra))
            for name, extra in CLASSES.items()}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_converted_bert_directory_passes_against_its_hf_directory(name, pairs):
    hf_dir, out_dir = pairs[name]
    before = _contents(hf_dir), _contents(out_dir)
    report_path = out_dir.parent / "report.json"
    r = run_verify(hf_dir, out_dir, "--device", "cpu", "--json", report_path)
    assert r.code == 0, r
    assert f"PaddleNLP 2.8.1's {name}" in r.stderr and "rules 'bert'" in r.stderr, r.stderr
    assert (_contents(hf_dir), _contents(out_dir)) == before
    report = json.loads(report_path.read_text())
    weights = report["loaded_weights"]
    assert report["verdict"] == "pass" and weights["mapping"] == "bert" and weights["checked"] >= 39
    assert not weights["differ"]
    prefix = "" if name == "BertModel" else "bert."  # HF's BertModel has no prefix of its own
    layers = {row["torch"] for row in report["layers"]}
    assert f"{prefix}encoder.layer.1.intermediate.dense" in layers and f"{prefix}pooler.dense" in layers, layers


def test_one_changed_weight_in_a_bert_directory_is_named(pairs, tmp_path):
    from converter.io.pdparams import load_pdparams
    hf_dir, out_dir = pairs["BertForSequenceClassification"]
    key = "bert.encoder.layers.1.linear1.weight"
    weights = load_pdparams(str(out_dir / "model_state.pdparams"))
    w = weights[key].copy()
    w[0, 7] += 0.25
    weights[key] = w
    planted = directory_with_weights(out_dir, tmp_path / "planted", weights)
    r = run_verify(hf_dir, planted, "--device", "cpu", "--json", tmp_path / "planted.json")
    assert r.code == 1, r
    report = json.loads((tmp_path / "planted.json").read_text())
    [differ] = report["loaded_weights"]["differ"]
    assert differ["paddle"] == key and differ["torch"] == "bert.encoder.layer.1.intermediate.dense.weight", differ
    assert differ["index"] == [0, 7] and differ["differ"] == 1
    assert report["first_bad_layer"]["torch"] == "bert.encoder.layer.1.intermediate.dense", report["first_bad_layer"]


def test_train_on_a_classifier_directory_names_the_padding_row_paddlenlp_trains(pairs, tmp_path):
    """HF's BERT embeds with padding_idx=pad_token_id (the [PAD] row gets no gradient); PaddleNLP
    2.8.1's has no padding_idx and trains that row. The padded row of the inputs holds pad_token_id,
    so the loss agrees and the backward is named at the word embeddings (measured: torch's gradient
    of row 0 is 0, paddle's 4.5e-4 under a sum of the logits)."""
    hf_dir, out_dir = pairs["BertForSequenceClassification"]
    r = run_verify(hf_dir, out_dir, "--device", "cpu", "--train", "--steps", "3", "--json", tmp_path / "train.json")
    assert r.code == 1, r
    assert "training checks: sequence-classification cross entropy (3 classes)" in r.stderr, r.stderr
    train = json.loads((tmp_path / "train.json").read_text())["train"]
    verdicts = {p["phase"]: p["verdict"] for p in train["phases"]}
    assert verdicts["loss"] == "pass" and verdicts["backward"] == "fail" and len(train["steps"]) == 3, verdicts
    first = train["first_bad"]
    assert first["phase"] == "backward" and first["torch"] == "bert.embeddings.word_embeddings.weight", first
    assert any("dropout set to 0" in note for note in train["notes"]), train["notes"]


def test_a_llama_directory_is_written_and_verified_for_the_installed_paddlenlp(tmp_path):
    """With PaddleNLP installed and PaddleFormers not, the zero-spec commands write PaddleNLP's
    layout (not PaddleFormers', the default where both are), record the library in OUT_DIR, and
    verify against PaddleNLP's class."""
    import importlib.util
    if importlib.util.find_spec("paddleformers") is not None:
        pytest.skip("both libraries installed: the default is PaddleFormers'")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    hf_dir, out_dir = converted_pair(tmp_path, transformers.LlamaForCausalLM, config)
    assert json.loads((out_dir / "config.json").read_text())["paddle_library"] == "paddlenlp"
    r = run_verify(hf_dir, out_dir, "--device", "cpu")
    assert r.code == 0, r
    assert "PaddleNLP 2.8.1's LlamaForCausalLM" in r.stderr and "rules 'llama'" in r.stderr, r.stderr


def test_a_config_field_set_otherwise_in_the_paddle_directory_is_named_in_the_hint(pairs, tmp_path):
    """PADDLE_DIR's config.json with another layer_norm_eps than HF_DIR's translates to: a note names
    the field, and the epsilon's confirmed cause has its hint name the field to set there."""
    import shutil
    hf_dir, out_dir = pairs["BertModel"]
    edited = tmp_path / "edited"
    shutil.copytree(out_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    assert config["layer_norm_eps"] == 1e-12
    config["layer_norm_eps"] = 1e-5
    (edited / "config.json").write_text(json.dumps(config))
    r = run_verify(hf_dir, edited, "--device", "cpu", "--bisect", "--json", tmp_path / "r.json")
    assert r.code == 1, r
    report = json.loads((tmp_path / "r.json").read_text())
    assert ("PADDLE_DIR's config.json differs from what HF_DIR's translates to: layer_norm_eps 1e-05 (HF_DIR's "
            "gives 1e-12)") in report["notes"]
    [eps] = [d for d in report["diagnosis"] if d["kind"] == "epsilon"]
    assert "confirmed by re-running" in eps["cause"], eps
    assert eps["hint"].endswith("in the directories: set layer_norm_eps to 1e-12 in PADDLE_DIR's config.json, as "
                                "HF_DIR's translates (or convert HF_DIR again)"), eps


def test_a_clean_directory_pair_says_no_config_field_apart(pairs, tmp_path):
    hf_dir, out_dir = pairs["BertModel"]
    r = run_verify(hf_dir, out_dir, "--device", "cpu", "--json", tmp_path / "r.json")
    assert r.code == 0, r
    assert not [n for n in json.loads((tmp_path / "r.json").read_text())["notes"] if "config.json differs" in n]


def test_gelu_new_in_hf_against_gelu_in_the_paddle_config_is_confirmed_at_the_activation(tmp_path):
    """HF's BERT with hidden_act gelu_new (the tanh approximation), converted with --force, and
    PADDLE_DIR's config.json set to PaddleNLP's "gelu" (exact): the first block is over budget at
    the input its code computes for its second Linear, and the held activation's `approximate` is
    the confirmed cause, with the config field named."""
    hf_dir, out_dir = converted_pair(tmp_path / "pair", transformers.BertModel,
                                     transformers.BertConfig(**SIZES, hidden_act="gelu_new"), "--force")
    config = json.loads((out_dir / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (out_dir / "config.json").write_text(json.dumps(config))
    r = run_verify(hf_dir, out_dir, "--device", "cpu", "--bisect", "--json", tmp_path / "r.json")
    assert r.code == 1, r
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["first_bad_layer"]["torch"] == "encoder.layer.0", report["first_bad_layer"]
    [cause] = [d for d in report["diagnosis"] if "confirmed by re-running" in d["cause"]]
    assert "gelu(..., approximate=False) through its attribute activation" in cause["cause"], cause
    assert "with approximate=True it gives torch's input of encoder.layer.0.output.dense" in cause["cause"], cause
