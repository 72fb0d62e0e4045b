"""--target paddleformers|paddlenlp: which library's shipped sets convert-weights uses, on files
and model directories (PaddleFormers itself is checked in tests/real_models_paddleformers)."""

import json

import numpy as np
import pytest
import torch

from converter.errors import UserError
from converter.hf.config import translate_config
from converter.io.pdparams import load_pdparams
from helpers.cli import run_convert
from helpers.hf_models import RECORDED, hf_state

H, Q, KV, D, FF, V = 64, 4, 2, 16, 128, 128


def _decoder(bias: bool) -> dict:
    """An HF 5 Llama-shaped (bias False) or Qwen2-shaped (bias True) causal LM's state, 2 layers."""
    torch.manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(V, H), "model.norm.weight": torch.randn(H),
             "lm_head.weight": torch.randn(V, H)}
    for i in range(2):
        p = f"model.layers.{i}."
        state |= {p + "self_attn.q_proj.weight": torch.randn(Q * D, H), p + "self_attn.k_proj.weight": torch.randn(KV * D, H),
                  p + "self_attn.v_proj.weight": torch.randn(KV * D, H), p + "self_attn.o_proj.weight": torch.randn(H, Q * D),
                  p + "mlp.gate_proj.weight": torch.randn(FF, H), p + "mlp.up_proj.weight": torch.randn(FF, H),
                  p + "mlp.down_proj.weight": torch.randn(H, FF), p + "input_layernorm.weight": torch.randn(H),
                  p + "post_attention_layernorm.weight": torch.randn(H)}
        if bias:
            state |= {p + "self_attn.q_proj.bias": torch.randn(Q * D), p + "self_attn.k_proj.bias": torch.randn(KV * D),
                      p + "self_attn.v_proj.bias": torch.randn(KV * D)}
    return state


def test_llama_file_goes_to_paddleformers_by_default_and_to_paddlenlp_when_asked(tmp):
    state = _decoder(bias=False)
    torch.save(state, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "pf.pdparams", "--quiet")
    assert r.code == 0, r
    line = r.stderr.splitlines()[0]
    assert line.startswith("mapping: detected 'paddleformers-llama' for PaddleFormers 1.2 (maps all 21 keys")
    assert "for PaddleNLP 2.8.1 ('llama') pass --target paddlenlp" in line
    pf = load_pdparams(str(tmp / "pf.pdparams"))
    assert sorted(pf) == sorted(state)  # PaddleFormers keeps HF's names
    q = state["model.layers.1.self_attn.q_proj.weight"].numpy()
    assert np.array_equal(pf["model.layers.1.self_attn.q_proj.weight"], q.T)
    assert np.array_equal(pf["lm_head.weight"], state["lm_head.weight"].numpy())  # LMHead keeps [vocab, hidden]

    n = run_convert(tmp / "m.bin", tmp / "nlp.pdparams", "--quiet", "--target", "paddlenlp")
    assert n.code == 0, n
    assert n.stderr.splitlines()[0].startswith("mapping: detected 'llama' for PaddleNLP 2.8.1")
    nlp = load_pdparams(str(tmp / "nlp.pdparams"))
    assert np.array_equal(nlp["llama.layers.1.self_attn.q_proj.weight"], q.T)
    assert np.array_equal(nlp["lm_head.weight"], state["lm_head.weight"].numpy().T)


def test_a_family_only_paddlenlp_has_goes_there_and_paddleformers_says_so(tmp):
    case = next(c for c in RECORDED if c["hf_class"] == "BertForSequenceClassification")
    torch.save(hf_state(case), tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "a.pdparams", "--quiet")
    assert r.code == 0 and "mapping: detected 'bert' for PaddleNLP 2.8.1" in r.stderr, r
    refused = run_convert(tmp / "m.bin", tmp / "b.pdparams", "--quiet", "--target", "paddleformers")
    assert refused.code == 2 and not (tmp / "b.pdparams").exists()
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert "no shipped mapping for PaddleFormers 1.2 fits" in lines[0] and "pass --target paddlenlp" in lines[0]


@pytest.mark.parametrize("value", ["paddle", "PaddleFormers", ""])
def test_an_unknown_target_is_one_line(tmp, value):
    torch.save(_decoder(bias=False), tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--target", value)
    assert r.code == 2 and not (tmp / "o.pdparams").exists()
    assert r.stderr.strip().splitlines() == [f"error: --target {value!r} is not a library this tool writes for; "
                                             "give paddleformers or paddlenlp"]


def _qwen2_dir(tmp) -> dict:
    from safetensors.torch import save_file
    state = _decoder(bias=True)
    (tmp / "hf").mkdir()
    save_file(state, str(tmp / "hf" / "model.safetensors"))
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "dtype": "float32", "hidden_size": H,
              "num_attention_heads": Q, "num_key_value_heads": KV, "num_hidden_layers": 2, "intermediate_size": FF,
              "vocab_size": V, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
              "layer_types": ["full_attention"] * 2, "tie_word_embeddings": False, "transformers_version": "5.3.0"}
    (tmp / "hf" / "config.json").write_text(json.dumps(config))
    return state


def _interleaved(parts, groups):
    """Per group: that group's block of each part in turn (on the last axis)."""
    blocks = [np.split(p, groups, axis=-1) for p in parts]
    return np.concatenate([b[g] for g in range(groups) for b in blocks], axis=-1)


def test_qwen2_directory_for_paddleformers(tmp):
    state = _qwen2_dir(tmp)
    r = run_convert(tmp / "hf", tmp / "out", "--quiet")
    assert r.code == 0, r
    assert "mapping: 'paddleformers-qwen2' for PaddleFormers 1.2 (config.json's model_type is 'qwen2')" in r.stderr
    config = json.loads((tmp / "out" / "config.json").read_text())
    hf_config = json.loads((tmp / "hf" / "config.json").read_text())
    assert config.pop("paddle_library") == "paddleformers"  # the library it was written for, which verify-port builds
    assert config == {k: v for k, v in hf_config.items() if k != "transformers_version"}  # HF 5's names, as written
    out = load_pdparams(str(tmp / "out" / "model_state.pdparams"))
    p = "model.layers.1."
    q, k, v = (state[p + f"self_attn.{x}_proj.weight"].numpy().T for x in "qkv")
    assert np.array_equal(out[p + "self_attn.qkv_proj.weight"], _interleaved([q, k, v], KV))
    assert not np.array_equal(out[p + "self_attn.qkv_proj.weight"], np.concatenate([q, k, v], axis=-1))
    qb, kb, vb = (state[p + f"self_attn.{x}_proj.bias"].numpy() for x in "qkv")
    assert np.array_equal(out[p + "self_attn.qkv_proj.bias"], _interleaved([qb, kb, vb], KV))
    gate, up = (state[p + f"mlp.{x}_proj.weight"].numpy().T for x in ("gate", "up"))
    assert np.array_equal(out[p + "mlp.up_gate_proj.weight"], np.concatenate([gate, up], axis=1))
    assert np.array_equal(out[p + "mlp.down_proj.weight"], state[p + "mlp.down_proj.weight"].numpy().T)
    assert len(out) == len(state) - 2 * (4 + 1)  # per layer: six q/k/v tensors become two, gate and up one


def test_qwen2_directory_for_paddlenlp_names_what_to_pass(tmp):
    _qwen2_dir(tmp)
    r = run_convert(tmp / "hf", tmp / "out", "--target", "paddlenlp")
    assert r.code == 2 and not (tmp / "out").exists()
    assert "model_type 'qwen2' is not one this tool translates for PaddleNLP 2.8.1" in r.stderr
    assert "pass --target paddleformers" in r.stderr


def test_rotary_parameters_differing_per_layer_type_are_refused_unless_forced():
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    hf = {"model_type": "qwen2", "num_key_value_heads": 2, "rope_parameters": rope}
    with pytest.raises(UserError) as info:
        translate_config(hf, target="paddleformers")
    assert "pass --force" in info.value.message and "one rotary table" in info.value.details[0]
    forced = translate_config(hf, force=True, target="paddleformers")
    assert forced.config["rope_parameters"] == rope and forced.notes[0].startswith("--force: 'rope_parameters'")
    same = {k: dict(v, rope_theta=1e4) for k, v in rope.items()}
    assert translate_config(dict(hf, rope_parameters=same), target="paddleformers").config["rope_parameters"] == same
