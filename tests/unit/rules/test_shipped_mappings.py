"""The shipped rule sets on checkpoints with HF names (PaddleNLP itself is checked by
scripts/check_mappings_paddlenlp.py in a separate environment)."""

import numpy as np
import pytest
import torch

from helpers.cli import run_convert
from converter.examples import bert_port as B
from converter.io.pdparams import load_pdparams


@pytest.mark.slow


def test_bert_mapping_names_and_transposes(tmp):
    model = B.torch_model()
    state = dict(model.state_dict())
    state["pooler.dense.weight"] = torch.randn(B.HIDDEN, B.HIDDEN)
    state["pooler.dense.bias"] = torch.randn(B.HIDDEN)
    state["embeddings.position_ids"] = torch.arange(B.MAX_POS)[None]
    torch.save({f"bert.{k}": v for k, v in state.items()} | {"classifier.weight": torch.randn(3, B.HIDDEN),
                                                             "classifier.bias": torch.randn(3)}, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "m.pdparams", "--mapping", "bert")
    assert r.code == 0, r
    out = load_pdparams(str(tmp / "m.pdparams"))
    q = state["encoder.layer.1.attention.self.query.weight"].numpy()
    assert np.array_equal(out["bert.encoder.layers.1.self_attn.q_proj.weight"], q.T)
    assert np.array_equal(out["bert.embeddings.word_embeddings.weight"], state["embeddings.word_embeddings.weight"].numpy())
    assert np.array_equal(out["bert.encoder.layers.0.norm2.weight"], state["encoder.layer.0.output.LayerNorm.weight"].numpy())
    assert out["classifier.weight"].shape == (B.HIDDEN, 3)
    assert "bert.embeddings.position_ids" not in out and len(out) == len(state) - 1 + 2


def test_gpt2_mapping_splits_c_attn_without_transposing(tmp):
    torch.manual_seed(0)
    d = 16
    state = {"wte.weight": torch.randn(50, d), "wpe.weight": torch.randn(32, d),
             "h.0.ln_1.weight": torch.randn(d), "h.0.ln_1.bias": torch.randn(d),
             "h.0.attn.c_attn.weight": torch.randn(d, 3 * d), "h.0.attn.c_attn.bias": torch.randn(3 * d),
             "h.0.attn.c_proj.weight": torch.randn(d, d), "h.0.attn.c_proj.bias": torch.randn(d),
             "h.0.attn.bias": torch.ones(1, 1, 32, 32), "h.0.ln_2.weight": torch.randn(d), "h.0.ln_2.bias": torch.randn(d),
             "h.0.mlp.c_fc.weight": torch.randn(d, 4 * d), "h.0.mlp.c_fc.bias": torch.randn(4 * d),
             "h.0.mlp.c_proj.weight": torch.randn(4 * d, d), "h.0.mlp.c_proj.bias": torch.randn(d),
             "ln_f.weight": torch.randn(d), "ln_f.bias": torch.randn(d)}
    torch.save(state, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "m.pdparams", "--mapping", "gpt2")
    assert r.code == 0, r
    out = load_pdparams(str(tmp / "m.pdparams"))
    w = state["h.0.attn.c_attn.weight"].numpy()
    assert np.array_equal(out["decoder.layers.0.self_attn.k_proj.weight"], w[:, d:2 * d])
    assert np.array_equal(out["decoder.layers.0.self_attn.out_proj.weight"], state["h.0.attn.c_proj.weight"].numpy())
    assert np.array_equal(out["decoder.layers.0.linear1.weight"], state["h.0.mlp.c_fc.weight"].numpy())
    assert out["decoder.norm.bias"].shape == (d,)


@pytest.mark.parametrize("prefix,target", [("model.", "llama."), ("", "")])
def test_llama_mapping(tmp, prefix, target):
    torch.manual_seed(0)
    d, f = 16, 40
    state = {f"{prefix}embed_tokens.weight": torch.randn(50, d), f"{prefix}norm.weight": torch.randn(d),
             f"{prefix}layers.0.self_attn.q_proj.weight": torch.randn(d, d),
             f"{prefix}layers.0.self_attn.k_proj.weight": torch.randn(d, d),
             f"{prefix}layers.0.self_attn.v_proj.weight": torch.randn(d, d),
             f"{prefix}layers.0.self_attn.o_proj.weight": torch.randn(d, d),
             f"{prefix}layers.0.self_attn.rotary_emb.inv_freq": torch.randn(d // 2),
             f"{prefix}layers.0.mlp.gate_proj.weight": torch.randn(f, d),
             f"{prefix}layers.0.mlp.up_proj.weight": torch.randn(f, d),
             f"{prefix}layers.0.mlp.down_proj.weight": torch.randn(d, f),
             f"{prefix}layers.0.input_layernorm.weight": torch.randn(d),
             f"{prefix}layers.0.post_attention_layernorm.weight": torch.randn(d)}
    torch.save(state, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "m.safetensors", "--mapping", "llama")
    assert r.code == 0, r
    from safetensors.numpy import load_file
    out = load_file(str(tmp / "m.safetensors"))
    assert np.array_equal(out[f"{target}layers.0.mlp.gate_proj.weight"], state[f"{prefix}layers.0.mlp.gate_proj.weight"].numpy().T)
    assert np.array_equal(out[f"{target}embed_tokens.weight"], state[f"{prefix}embed_tokens.weight"].numpy())
    assert len(out) == len(state) - 1
