"""verify-port on HF 5's grouped routers against PaddleFormers 1.2's: tiny random DeepSeek-V3 and
GLM-4-MoE models (8 experts in 4 groups, the best 2 groups, top-2, normalised, scaled by 2.5, a
score-correction bias of its own in every router) through the shipped rule sets. HF's router returns
its logits and leaves the routing to its MoE block; PaddleFormers' routes and returns the chosen
experts and their weights. Both are compared as the routing weights: the clean pairs pass with
every router judged within its budget, and a router that scales its weights by another factor or
chooses with another correction bias is named at the router. Runs in the second side environment
(scripts/side_env_paddleformers.sh)."""

import numpy as np
import pytest
import torch

from hf_paddleformers import hf_logits, paddleformers_config, paddleformers_model, transformers
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             num_hidden_layers=3, vocab_size=128, tie_word_embeddings=False, first_k_dense_replace=1,
             n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, norm_topk_prob=True,
             routed_scaling_factor=2.5, moe_intermediate_size=32)
# family -> (HF config class, HF causal-LM class, PaddleFormers' class, config fields)
CASES = {
    # DeepSeek-V3's own YaRN settings with its own max_position_embeddings (factor x original), which
    # PaddleFormers takes YaRN's factor from (test_verify_divergences.py)
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM",
                    {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                     "v_head_dim": 16, "num_key_value_heads": 4, "head_dim": 8, "max_position_embeddings": 40 * 4096,
                     "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                         "original_max_position_embeddings": 4096, "mscale": 1.0,
                                         "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}}),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", "Glm4MoeForCausalLMDeprecated", {"use_qk_norm": True}),
}
ROUTERS = ("model.layers.1.mlp.gate", "model.layers.2.mlp.gate")


def _config(family):
    config_class, _, _, extra = CASES[family]
    return getattr(transformers, config_class)(**{**SIZES, **extra})


def _hf(family):
    def build():
        config = _config(family)
        config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
        model = hf_logits(getattr(transformers, CASES[family][1]), config)
        with torch.no_grad():  # a bias of its own per router (HF starts them at 0), of the scores' spread
            for seed, path in enumerate(ROUTERS):
                bias = model.get_submodule(path).e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(seed)) * 0.01)
        return model
    return build


def _paddleformers(family, plant=None):
    def build():
        config = paddleformers_config(family, CASES[family][0], _config(family))
        model = paddleformers_model(family, CASES[family][2], config).eval()
        if plant is not None:
            plant(model.get_sublayer(ROUTERS[1]))
        return model
    return build


def _scaled_by_one(router):
    router.routed_scaling_factor = 1.0  # the config's 2.5 not applied


def _chooses_without_its_bias(router):
    """The router's choice made with a correction bias of 0 (the loaded bias left out of the
    choice), its weights still the chosen experts' scores."""
    choose = router.get_topk_indices

    def without_bias(scores):
        return choose(scores - router.e_score_correction_bias.unsqueeze(0))
    router.get_topk_indices = without_bias


def _inputs():
    return (np.random.default_rng(0).integers(0, SIZES["vocab_size"], (2, 12)).astype("int64"),)


def _verify(family, strategy="full", plant=None):
    spec = spec_from_functions(_hf(family), _paddleformers(family, plant), _inputs, mapping=f"paddleformers-{family}")
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


WHOLE_PAIR = ["deepseek_v3", "glm4_moe"]  # (DeepSeek-V3's decoder layers take cos and sin stacked in one tensor)


def _routers(report) -> dict:
    return {r.torch: r for r in report.layers if r.torch in ROUTERS}


@pytest.mark.parametrize("family", sorted(CASES))
def test_the_routers_of_a_clean_pair_are_compared_as_the_routing_within_budget(family):
    routers = _routers(_verify(family))
    assert sorted(routers) == sorted(ROUTERS), sorted(routers)
    for row in routers.values():
        assert row.ratio is not None and row.ratio < 1, row
        assert row.shape == (24, 2), row  # each token's two routing weights
        assert "routed as its block routes them" in row.note and "best 2 of 4 groups" in row.note \
            and "scaled by 2.5" in row.note, row.note


@pytest.mark.parametrize("family", WHOLE_PAIR)
@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_clean_pair_passes(family, strategy):
    report = _verify(family, strategy)
    assert report.verdict == "pass", (report.first_bad, report.notes[:3])
    assert report.outputs is not None and report.outputs.within_budget


@pytest.mark.parametrize("family", sorted(CASES))
@pytest.mark.parametrize("plant", [_scaled_by_one, _chooses_without_its_bias])
def test_a_router_bug_puts_that_router_over_its_budget(family, plant):
    routers = _routers(_verify(family, plant=plant))
    assert routers[ROUTERS[0]].ratio < 1 < routers[ROUTERS[1]].ratio, routers


@pytest.mark.parametrize("family", WHOLE_PAIR)
@pytest.mark.parametrize("plant", [_scaled_by_one, _chooses_without_its_bias])
def test_a_router_bug_is_named_at_the_router(family, plant):
    report = _verify(family, plant=plant)
    assert report.verdict == "fail"
    assert report.first_bad.torch == ROUTERS[1], report.first_bad
