"""Model directories for PaddleFormers 1.2 without PaddleFormers: tied and untied LM heads, and the
MoE rule sets on a saved file's per-expert tensors and a live HF 5 module's stacked experts
(PaddleFormers itself loads them in tests/real_models_paddleformers/test_directories.py)."""

import json

import numpy as np
import pytest
import torch

from converter.errors import UserError
from converter.hf.config import translate_config
from converter.io.pdparams import load_pdparams
from helpers.cli import run_convert

H, Q, KV, D, V, E, I, S = 64, 4, 2, 16, 128, 4, 32, 48


def _interleaved(parts, groups):
    blocks = [np.split(p, groups, axis=-1) for p in parts]
    return np.concatenate([b[g] for g in range(groups) for b in blocks], axis=-1)


def _llama(head: bool) -> dict:
    torch.manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(V, H), "model.norm.weight": torch.randn(H)}
    if head:
        state["lm_head.weight"] = torch.randn(V, H)
    p = "model.layers.0."
    state |= {p + "self_attn.q_proj.weight": torch.randn(Q * D, H), p + "self_attn.k_proj.weight": torch.randn(KV * D, H),
              p + "self_attn.v_proj.weight": torch.randn(KV * D, H), p + "self_attn.o_proj.weight": torch.randn(H, Q * D),
              p + "mlp.gate_proj.weight": torch.randn(I, H), p + "mlp.up_proj.weight": torch.randn(I, H),
              p + "mlp.down_proj.weight": torch.randn(H, I), p + "input_layernorm.weight": torch.randn(H),
              p + "post_attention_layernorm.weight": torch.randn(H)}
    return state


def _directory(tmp, state: dict, config: dict, name: str = "hf"):
    from safetensors.torch import save_file
    (tmp / name).mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / name / "model.safetensors"))
    (tmp / name / "config.json").write_text(json.dumps(config))
    return tmp / name


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "num_attention_heads": Q,
         "num_key_value_heads": KV, "num_hidden_layers": 1, "intermediate_size": I, "vocab_size": V}


def test_a_llama_config_that_does_not_say_gets_hfs_untied_head_written_and_said():
    translated = translate_config(dict(LLAMA), target="paddleformers")
    assert translated.config["tie_word_embeddings"] is False
    said = [n for n in translated.notes if "tie_word_embeddings" in n]
    assert len(said) == 1 and "HF unties the LM head by default" in said[0] and "would tie it" in said[0]
    for value in (True, False):  # a config that says is copied as it is, with nothing to say
        given = translate_config(dict(LLAMA, tie_word_embeddings=value), target="paddleformers")
        assert given.config["tie_word_embeddings"] is value
        assert not [n for n in given.notes if "tie_word_embeddings" in n]


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "phi3", "ernie4_5", "qwen2_moe", "qwen3_moe"])
def test_families_whose_defaults_agree_are_copied_without_the_field(model_type):
    translated = translate_config({"model_type": model_type, "num_key_value_heads": KV}, target="paddleformers")
    assert "tie_word_embeddings" not in translated.config and not translated.notes


def test_a_tied_heads_copy_is_left_out_and_said(tmp):
    state = _llama(head=True)
    src = _directory(tmp, state, dict(LLAMA, tie_word_embeddings=True))
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r
    assert "note: left out 'lm_head.weight': config.json ties it to the word embeddings" in r.stderr
    out = load_pdparams(str(tmp / "out" / "model_state.pdparams"))
    assert "lm_head.weight" not in out and len(out) == len(state) - 1
    assert np.array_equal(out["model.embed_tokens.weight"], state["model.embed_tokens.weight"].numpy())


def test_a_tied_config_without_a_head_converts(tmp):
    src = _directory(tmp, _llama(head=False), dict(LLAMA, tie_word_embeddings=True))
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0 and "left out" not in r.stderr, r


@pytest.mark.parametrize("said", [True, False])
def test_an_untied_causal_lm_without_a_head_is_refused(tmp, said):
    config = dict(LLAMA, tie_word_embeddings=False) if said else dict(LLAMA)  # llama unties by default
    src = _directory(tmp, _llama(head=False), config)
    r = run_convert(src, tmp / "out")
    assert r.code == 2 and not (tmp / "out").exists()
    lines = [line for line in r.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "weights hold no 'lm_head.weight'" in lines[0] and "random values" in lines[0]


def test_a_base_model_without_a_head_converts(tmp):
    src = _directory(tmp, _llama(head=False), dict(LLAMA, architectures=["LlamaModel"], tie_word_embeddings=False))
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r


def test_force_replaces_a_directory_paddleformers_wrote_its_metadata_into(tmp):
    src = _directory(tmp, _llama(head=True), dict(LLAMA, tie_word_embeddings=False))
    assert run_convert(src, tmp / "out", "--quiet").code == 0
    (tmp / "out" / "flex-ckpt.auto_generated.metadata").write_bytes(b"written by PaddleFormers' default loader")
    r = run_convert(src, tmp / "out", "--quiet", "--force")
    assert r.code == 0, r
    assert sorted(p.name for p in (tmp / "out").iterdir()) == ["config.json", "model_state.pdparams"]
    (tmp / "out" / "notes.txt").write_text("mine")
    refused = run_convert(src, tmp / "out", "--force")
    assert refused.code == 2 and "notes.txt" in refused.stderr and (tmp / "out" / "notes.txt").exists()


def _moe(family: str, stacked: bool) -> dict:
    """A 1-layer HF 5 MoE causal LM's state: per-expert tensors (a saved file) or stacked (a live module)."""
    torch.manual_seed(1)
    p = "model.layers.0."
    state = {"model.embed_tokens.weight": torch.randn(V, H), "model.norm.weight": torch.randn(H),
             "lm_head.weight": torch.randn(V, H), p + "input_layernorm.weight": torch.randn(H),
             p + "post_attention_layernorm.weight": torch.randn(H),
             p + "self_attn.q_proj.weight": torch.randn(Q * D, H), p + "self_attn.k_proj.weight": torch.randn(KV * D, H),
             p + "self_attn.v_proj.weight": torch.randn(KV * D, H), p + "self_attn.o_proj.weight": torch.randn(H, Q * D),
             p + "mlp.gate.weight": torch.randn(E, H)}
    if family == "qwen3_moe":
        state |= {p + "self_attn.q_norm.weight": torch.randn(D), p + "self_attn.k_norm.weight": torch.randn(D)}
    else:
        state |= {p + "self_attn.q_proj.bias": torch.randn(Q * D), p + "self_attn.k_proj.bias": torch.randn(KV * D),
                  p + "self_attn.v_proj.bias": torch.randn(KV * D), p + "mlp.shared_expert_gate.weight": torch.randn(1, H),
                  p + "mlp.shared_expert.gate_proj.weight": torch.randn(S, H),
                  p + "mlp.shared_expert.up_proj.weight": torch.randn(S, H),
                  p + "mlp.shared_expert.down_proj.weight": torch.randn(H, S)}
    gate_up, down = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    if stacked:
        state |= {p + "mlp.experts.gate_up_proj": gate_up, p + "mlp.experts.down_proj": down}
    else:
        for e in range(E):
            state |= {p + f"mlp.experts.{e}.gate_proj.weight": gate_up[e, :I], p + f"mlp.experts.{e}.up_proj.weight": gate_up[e, I:],
                      p + f"mlp.experts.{e}.down_proj.weight": down[e]}
    return state


def _moe_config(family: str) -> dict:
    config = {"architectures": [{"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family]],
              "model_type": family, "hidden_size": H, "num_attention_heads": Q, "num_key_value_heads": KV, "head_dim": D,
              "num_hidden_layers": 1, "moe_intermediate_size": I, "num_experts_per_tok": 2, "vocab_size": V,
              "tie_word_embeddings": False, "dtype": "float32"}
    return config | ({"num_experts": E, "shared_expert_intermediate_size": S} if family == "qwen2_moe"
                     else {"num_local_experts": E})


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
def test_moe_rule_sets_write_paddleformers_layout_from_saved_and_live_experts(tmp, family):
    saved, live = _moe(family, stacked=False), _moe(family, stacked=True)
    outs = {}
    for name, state in (("saved", saved), ("live", live)):
        r = run_convert(_directory(tmp, state, _moe_config(family), name), tmp / f"out-{name}", "--quiet")
        assert r.code == 0, r
        assert f"mapping: 'paddleformers-{family}' for PaddleFormers 1.2" in r.stderr
        outs[name] = load_pdparams(str(tmp / f"out-{name}" / "model_state.pdparams"))
    out = outs["saved"]
    assert sorted(out) == sorted(outs["live"]) and all(np.array_equal(out[k], outs["live"][k]) for k in out)
    p = "model.layers.0."
    for e in range(E):
        gate, up = (saved[p + f"mlp.experts.{e}.{x}_proj.weight"].numpy().T for x in ("gate", "up"))
        assert np.array_equal(out[p + f"mlp.experts.{e}.up_gate_proj.weight"], np.concatenate([gate, up], axis=1))
        assert np.array_equal(out[p + f"mlp.experts.{e}.down_proj.weight"], saved[p + f"mlp.experts.{e}.down_proj.weight"].numpy().T)
    assert out[p + "mlp.gate.weight"].shape == (H, E) and out[p + "mlp.gate.weight"].dtype == np.float32
    assert np.array_equal(out[p + "mlp.gate.weight"], saved[p + "mlp.gate.weight"].numpy().T)
    q, k, v = (saved[p + f"self_attn.{x}_proj.weight"].numpy().T for x in "qkv")
    assert np.array_equal(out[p + "self_attn.qkv_proj.weight"], _interleaved([q, k, v], KV))
    if family == "qwen2_moe":
        qb, kb, vb = (saved[p + f"self_attn.{x}_proj.bias"].numpy() for x in "qkv")
        assert np.array_equal(out[p + "self_attn.qkv_proj.bias"], _interleaved([qb, kb, vb], KV))
        gate, up = (saved[p + f"mlp.shared_expert.{x}_proj.weight"].numpy().T for x in ("gate", "up"))
        assert np.array_equal(out[p + "mlp.shared_expert.up_gate_proj.weight"], np.concatenate([gate, up], axis=1))
        assert np.array_equal(out[p + "mlp.shared_expert_gate.weight"], saved[p + "mlp.shared_expert_gate.weight"].numpy().T)
        assert out[p + "mlp.shared_expert_gate.weight"].shape == (H, 1)
    else:
        assert np.array_equal(out[p + "self_attn.q_norm.weight"], saved[p + "self_attn.q_norm.weight"].numpy())


def test_moe_rule_set_names_a_dense_layer_it_does_not_map(tmp):
    state = _moe("qwen3_moe", stacked=False) | {"model.layers.0.mlp.down_proj.weight": torch.randn(H, I)}
    r = run_convert(_directory(tmp, state, _moe_config("qwen3_moe")), tmp / "out")
    assert r.code == 2 and not (tmp / "out").exists() and "Traceback" not in r.stderr
    assert "model.layers.0.mlp.down_proj.weight" in r.stderr



@pytest.mark.parametrize("head", [True, False])
def test_a_tied_moe_head_is_written_as_the_embeddings_copy(tmp, head):
    """PaddleFormers' Qwen3-MoE class does not tie a tied head itself: the head is the embeddings,
    written again (a differing copy in the weights is HF's to ignore, and so it is here)."""
    state = _moe("qwen3_moe", stacked=False)
    if not head:
        del state["lm_head.weight"]
    src = _directory(tmp, state, dict(_moe_config("qwen3_moe"), tie_word_embeddings=True))
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r
    assert "note: wrote 'lm_head.weight' as a copy of 'model.embed_tokens.weight'" in r.stderr
    out = load_pdparams(str(tmp / "out" / "model_state.pdparams"))
    embeddings = state["model.embed_tokens.weight"].numpy()
    assert np.array_equal(out["lm_head.weight"], embeddings) and np.array_equal(out["model.embed_tokens.weight"], embeddings)


def test_per_layer_type_rotary_parameters_that_agree_get_their_base_written_as_rope_theta():
    """PaddleFormers 1.2's Gemma 3 reads its rotary base from rope_theta (default 1e6), not from HF 5's
    per-layer-type rope_parameters: the common base is written, and said."""
    rope = {t: {"rope_type": "default", "rope_theta": 10000.0} for t in ("full_attention", "sliding_attention")}
    translated = translate_config({"model_type": "gemma3_text", "num_key_value_heads": 1, "rope_parameters": rope},
                                  target="paddleformers")
    assert translated.config["rope_theta"] == 10000.0 and translated.config["rope_parameters"] == rope
    assert [n for n in translated.notes if n.startswith("wrote rope_theta: 10000.0")]
    given = translate_config({"model_type": "gemma3_text", "rope_parameters": rope, "rope_theta": 10000.0},
                             target="paddleformers")
    assert given.config["rope_theta"] == 10000.0 and not given.notes
    with pytest.raises(UserError) as info:  # HF uses rope_parameters' base, PaddleFormers rope_theta
        translate_config({"model_type": "gemma3_text", "rope_parameters": rope, "rope_theta": 5.0}, target="paddleformers")
    assert "'rope_theta' 5.0 differs from the rotary base" in info.value.details[0]
    plain = translate_config({"model_type": "qwen3", "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                             target="paddleformers")
    assert "rope_theta" not in plain.config
