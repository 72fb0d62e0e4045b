"""`convert-weights HF_DIR OUT_DIR`: config.json and weights in, what PaddleNLP's from_pretrained
loads out (scripts/check_mappings_paddlenlp.py loads such directories with PaddleNLP itself)."""

import pytest
import json
import os

import numpy as np
import torch

from helpers.cli import run_convert
from converter.io.pdparams import load_pdparams
from helpers.hf_models import BERT, BERT_CONFIG, RECORDED, hf_dir, hf_state, load_dir

def single_file(tmp, state):
    torch.save(state, tmp / "single.bin")
    assert run_convert(tmp / "single.bin", tmp / "single.pdparams", "--quiet").code == 0
    return load_pdparams(str(tmp / "single.pdparams"))


def assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


@pytest.mark.slow


def test_single_file_directory(tmp):
    state = hf_state(BERT)
    src = hf_dir(tmp / "hf", state)
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r
    assert sorted(os.listdir(tmp / "out")) == ["config.json", "model_state.pdparams"]
    assert "mapping: 'bert' for PaddleNLP 2.8.1 (config.json's model_type is 'bert')" in r.stderr
    assert_same(load_dir(tmp / "out"), single_file(tmp, state))
    config = json.loads((tmp / "out" / "config.json").read_text())
    assert config == {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 300, "type_vocab_size": 2,
                      "layer_norm_eps": 1e-12, "hidden_act": "gelu", "paddle_library": "paddlenlp"}


@pytest.mark.slow


def test_sharded_source_gives_sharded_output_with_an_index(tmp):
    state = hf_state(BERT)
    src = hf_dir(tmp / "hf", state, shards=3)
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r
    files = sorted(os.listdir(tmp / "out"))
    shards = [f for f in files if f.startswith("model_state-")]
    assert len(shards) >= 2 and all(f.endswith(f"-of-{len(shards):05d}.pdparams") for f in shards)
    assert "model_state.pdparams.index.json" in files and "model_state.pdparams" not in files
    index = json.loads((tmp / "out" / "model_state.pdparams.index.json").read_text())
    got = load_dir(tmp / "out")
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in got.values())
    assert_same(got, single_file(tmp, state))


@pytest.mark.slow


def test_max_shard_size_shards_a_single_file_source(tmp):
    state = hf_state(BERT)
    src = hf_dir(tmp / "hf", state)
    r = run_convert(src, tmp / "out", "--quiet", "--max-shard-size", "50KB")
    assert r.code == 0, r
    index = json.loads((tmp / "out" / "model_state.pdparams.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3
    for shard in shards:  # each at most 50 kB of tensor data unless one tensor alone is larger
        part = load_pdparams(str(tmp / "out" / shard))
        assert sum(a.nbytes for a in part.values()) <= 50_000 or len(part) == 1
    assert_same(load_dir(tmp / "out"), single_file(tmp, state))


def test_a_config_field_without_counterpart_is_an_error_unless_forced(tmp):
    src = hf_dir(tmp / "hf", hf_state(BERT), dict(BERT_CONFIG, position_embedding_type="relative_key"))
    r = run_convert(src, tmp / "out")
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "'position_embedding_type': 'relative_key' has no PaddleNLP counterpart" in r.stderr
    assert "--force" in r.stderr.splitlines()[0]
    assert sorted(os.listdir(tmp)) == ["hf"]  # no output directory, nothing half-written beside it
    r = run_convert(src, tmp / "out", "--force", "--quiet")
    assert r.code == 0, r
    assert json.loads((tmp / "out" / "config.json").read_text())["position_embedding_type"] == "relative_key"


def test_an_existing_output_directory_needs_force_and_must_be_one_this_tool_wrote(tmp):
    src = hf_dir(tmp / "hf", hf_state(BERT))
    (tmp / "out").mkdir()
    (tmp / "out" / "old.txt").write_text("old")
    r = run_convert(src, tmp / "out")
    assert r.code == 2 and "already exists; pass --force" in r.stderr
    r = run_convert(src, tmp / "out", "--force", "--quiet")
    assert r.code == 2 and "holds 'old.txt', which convert-weights does not write" in r.stderr, r
    assert os.listdir(tmp / "out") == ["old.txt"]
    (tmp / "out" / "old.txt").unlink()
    (tmp / "out" / "config.json").write_text("{}")  # what an earlier conversion left: replaced
    (tmp / "out" / "model_state-00001-of-00002.pdparams").write_bytes(b"old shard")
    assert run_convert(src, tmp / "out", "--force", "--quiet").code == 0
    assert sorted(os.listdir(tmp / "out")) == ["config.json", "model_state.pdparams"]
    assert json.loads((tmp / "out" / "config.json").read_text())["hidden_size"] == 64
    assert sorted(os.listdir(tmp)) == ["hf", "out"]


def test_a_failed_conversion_leaves_nothing(tmp):
    state = hf_state(BERT)
    state["encoder.layer.0.extra.weight"] = torch.ones(3)
    src = hf_dir(tmp / "hf", state)
    r = run_convert(src, tmp / "out")
    assert r.code == 2 and "'encoder.layer.0.extra.weight' float32[3] is not mapped" in r.stderr
    assert sorted(os.listdir(tmp)) == ["hf"]


def test_tied_t5_head_is_left_out(tmp):
    case = next(c for c in RECORDED if c["family"] == "t5" and c["how"] == "bin" and c["note"].startswith("tied"))
    state = hf_state(case)
    config = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128,
              "num_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8, "vocab_size": 300}
    src = hf_dir(tmp / "hf", state, config)
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r
    assert "left out 'lm_head.weight': config.json ties it" in r.stderr
    out = load_dir(tmp / "out")
    assert "lm_head.weight" not in out and np.array_equal(out["t5.shared.weight"], state["shared.weight"].numpy())


def test_max_shard_size_needs_a_model_directory(tmp):
    torch.save(hf_state(BERT), tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--max-shard-size", "1GB")
    assert r.code == 2 and "--max-shard-size applies when SRC is an HF model directory" in r.stderr
    src = hf_dir(tmp / "hf", hf_state(BERT))
    r = run_convert(src, tmp / "out", "--max-shard-size", "lots")
    assert r.code == 2 and "is not a size" in r.stderr and not os.path.exists(tmp / "out")
