"""DeepSeek-V3's YaRN rotary table against PaddleFormers 1.2's, diagnosed by its rotary parameters:
HF 5 takes YaRN's factor from rope_parameters' `factor`, PaddleFormers from max_position_embeddings /
original_max_position_embeddings whenever the latter is given. With HF's default
max_position_embeddings (4096 = original) the tables differ and the diagnosis at rotary_emb names
both readings and their values; with the paddle model's max_position_embeddings changed in its
config alone, the paddle model's value is named. Runs in the second side environment
(scripts/side_env_paddleformers.sh)."""

import numpy as np

from hf_paddleformers import hf_logits, paddleformers_config, paddleformers_model, transformers
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

FIELDS = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=8, intermediate_size=128,
              num_hidden_layers=2, vocab_size=128, tie_word_embeddings=False, n_routed_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
              q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                               "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0,
                               "beta_fast": 32.0, "beta_slow": 1.0})


def _hf_config(max_position_embeddings):
    return transformers.DeepseekV3Config(**FIELDS, max_position_embeddings=max_position_embeddings)


def _hf(max_position_embeddings):
    def build():
        config = _hf_config(max_position_embeddings)
        config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
        return hf_logits(transformers.DeepseekV3ForCausalLM, config)
    return build


def _paddleformers(max_position_embeddings):
    def build():
        config = paddleformers_config("deepseek_v3", "DeepseekV3Config", _hf_config(max_position_embeddings))
        return paddleformers_model("deepseek_v3", "DeepseekV3ForCausalLM", config).eval()
    return build


def _rotary_diagnosis(hf_longest, paddle_longest) -> list:
    spec = spec_from_functions(_hf(hf_longest), _paddleformers(paddle_longest),
                               lambda: (np.random.default_rng(0).integers(0, 128, (2, 12)).astype("int64"),),
                               mapping="paddleformers-deepseek_v3")
    report = verify(spec, Options(device="cpu"), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "model.rotary_emb", report.first_bad
    # the table differs by about 1% of its size, which a bf16 budget would hold too: the field that
    # reproduces paddle's table outranks that fit by size
    assert not any(d.kind in ("tf32", "fp16", "bf16", "own rounding") for d in report.diagnosis), report.diagnosis
    return [d for d in report.diagnosis if d.kind == "rotary"]


def test_the_yarn_factor_read_from_the_lengths_is_named_at_rotary_emb():
    [found] = _rotary_diagnosis(4096, 4096)
    assert "the paddle model's max_position_embeddings / original_max_position_embeddings (4096 / 4096 = 1) instead " \
           "of rope_parameters['factor'] (40)" in found.cause, found
    assert "163840" in found.hint, found  # factor x original


def test_a_max_position_embeddings_of_the_paddle_config_alone_is_named_with_its_value():
    [found] = _rotary_diagnosis(40 * 4096, 20 * 4096)
    assert "(81920 / 4096 = 20) instead of rope_parameters['factor'] (40)" in found.cause, found
