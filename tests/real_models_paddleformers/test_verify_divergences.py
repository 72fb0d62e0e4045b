"""verify-port on PaddleFormers 1.2's divergences from HF transformers 5, each named at its module:
tiny random HF 5 models against PaddleFormers' classes built from the same config, weights through
the shipped rule sets.

* GPT-OSS in eval mode: PaddleFormers' experts take a batched path that reorders the routing weights
  with `transpose([0, 1])` (the identity in paddle), so tokens get other tokens' expert weights. The
  routers agree (compared by meaning: PaddleFormers scatters the top-k weights over the experts); the
  experts are named.
* Gemma 3 with HF's per-layer-type rotary bases (1e6 for full attention, 1e4 for the sliding window):
  PaddleFormers builds one rotary table, from rope_theta, for every layer. Named at `rotary_emb`.
* DeepSeek-V3 with YaRN whose `factor` differs from max_position_embeddings /
  original_max_position_embeddings: PaddleFormers takes the factor from that ratio (1 here: no
  interpolation), HF 5 from `factor`. Named at `rotary_emb`.

Runs in the second side environment (scripts/side_env_paddleformers.sh)."""

import numpy as np
import pytest

from hf_paddleformers import hf_logits, paddleformers_config, paddleformers_model, transformers
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             num_hidden_layers=2, vocab_size=128, tie_word_embeddings=False)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
# family -> (HF config class, HF causal-LM class, PaddleFormers' class, config fields)
CASES = {
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # HF's default bases per layer type (full 1e6, sliding 1e4); PaddleFormers reads rope_theta (1e6)
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3ForCausalLM",
                    {"tie_word_embeddings": True, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
                     "rope_theta": 1e6}),
    # HF's default max_position_embeddings (4096): factor 40 for HF, 4096 / 4096 = 1 for PaddleFormers
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM",
                    {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                     "n_group": 1, "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                     "qk_nope_head_dim": 8, "v_head_dim": 16, "num_key_value_heads": 4, "head_dim": 8,
                     "rope_parameters": YARN}),
}


def _config(family):
    config_class, _, _, extra = CASES[family]
    fields = {**SIZES, **extra}
    fields.pop("rope_theta", None)  # HF 5 reads rope_parameters; PaddleFormers' copy gets it below
    return getattr(transformers, config_class)(**fields)


def _hf(family):
    def build():
        config = _config(family)
        config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
        return hf_logits(getattr(transformers, CASES[family][1]), config)
    return build


def _paddleformers(family, train_mode=False):
    def build():
        config = paddleformers_config(family, CASES[family][0], _config(family))
        if "rope_theta" in CASES[family][3]:
            config.rope_theta = CASES[family][3]["rope_theta"]
        model = paddleformers_model(family, CASES[family][2], config)
        model.train() if train_mode else model.eval()
        return model
    return build


def _inputs():
    return (np.random.default_rng(0).integers(0, SIZES["vocab_size"], (2, 12)).astype("int64"),)


def _verify(family, strategy="full", train_mode=False):
    spec = spec_from_functions(_hf(family), _paddleformers(family, train_mode), _inputs,
                               mapping=f"paddleformers-{family}")
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_gpt_oss_in_eval_mode_is_named_at_its_experts_with_the_routers_agreeing(strategy):
    report = _verify("gpt_oss", strategy)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "model.layers.0.mlp.experts", report.first_bad
    if strategy == "full":
        routers = [r for r in report.layers if r.torch.endswith("mlp.router")]
        assert routers and all(r.ratio is not None and r.ratio < 1 for r in routers), routers
        assert all("scattered" in r.note for r in routers), [r.note for r in routers]
    assert not any("TF32" in d.cause for d in report.diagnosis), report.diagnosis
    found = [d for d in report.diagnosis if d.kind == "routing weights"]
    assert len(found) == 1 and found[0].layer == "model.layers.0.mlp.experts", report.diagnosis
    assert "applied to other tokens" in found[0].cause and "read as [experts, tokens]" in found[0].cause, found[0]


def test_gemma3s_sliding_table_is_diagnosed_as_built_with_the_full_attention_base():
    report = _verify("gemma3_text")
    found = [d for d in report.diagnosis if d.kind == "rotary"]
    assert len(found) == 1 and found[0].layer == "model.rotary_emb", report.diagnosis
    assert "sliding_attention rotary table is built with the full_attention layers' rope parameters: rope_theta " \
           "1000000.0 instead of 10000.0" in found[0].cause, found[0]


@pytest.mark.parametrize("family", ["gemma3_text", "deepseek_v3"])
def test_a_rotary_table_that_differs_is_named_at_rotary_emb(family):
    report = _verify(family)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "model.rotary_emb", report.first_bad
    assert report.first_bad.cosine < 0.9999 and report.first_bad.max_abs > 1e-2, report.first_bad


@pytest.mark.parametrize("family", ["gemma3_text", "deepseek_v3"])
def test_a_rotary_table_that_differs_is_not_diagnosed_as_rounding(family):
    report = _verify(family)
    assert report.first_bad.torch == "model.rotary_emb", report.first_bad
    assert not any("TF32" in d.cause or d.kind == "own rounding" for d in report.diagnosis), report.diagnosis


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_gemma3_with_one_rotary_base_passes_its_norms_compared_in_torch_order(strategy, monkeypatch):
    """With the same base for both layer types PaddleFormers' Gemma 3 is HF's: the pair passes, its
    q/k norms (on [batch, tokens, heads, dim] where HF's are on [batch, heads, tokens, dim])
    compared with their axes in torch's order."""
    same = {"rope_type": "default", "rope_theta": 1e6}
    monkeypatch.setitem(CASES["gemma3_text"][3], "rope_parameters", {"full_attention": same, "sliding_attention": same})
    report = _verify("gemma3_text", strategy)
    assert report.verdict == "pass", (report.first_bad, report.notes[:3])
    if strategy == "full":
        norms = [r for r in report.layers if r.torch.endswith(("q_norm", "k_norm"))]
        assert norms and all(r.ratio is not None and r.ratio < 1 and "axes in the order" in r.note for r in norms), norms

