"""verify-port on the PaddleFormers 1.2 families' cells the other files leave out, under both
strategies: tiny random HF 5 models against PaddleFormers' classes built from the same config,
weights through the shipped rule sets, each bug planted in the paddle model after it is built.

* Qwen3-MoE and ERNIE 4.5: the clean pair passes; planted bugs are named.
* GPT-OSS with its eval-mode divergence set aside (PaddleFormers' experts made to take their
  per-expert path, the one they take in train mode; verify-port runs both models in eval mode):
  the clean pair passes; planted bugs are named.
* Gemma 3 with one rotary base for both layer types (with two, PaddleFormers' own divergence,
  test_verify_divergences.py), DeepSeek-V3 with its YaRN factor equal to the lengths' ratio, and
  GLM-4-MoE (their clean pairs pass in test_verify_divergences.py and
  test_verify_grouped_routers.py): planted bugs outside the routers are named.

A bug is named at the smallest module both sides have around it: an RMSNorm epsilon (with an
epsilon diagnosis under full) and an activation at their own module; an activation inside
the routed experts, which HF 5 runs as one module of stacked weights where PaddleFormers has a
layer per expert, at the MoE block, whose diagnosis names both sides' experts as having no
counterpart. Runs in the second side environment (scripts/side_env_paddleformers.sh)."""

from typing import NamedTuple

import numpy as np
import pytest

from hf_paddleformers import hf_logits, paddleformers_config, paddleformers_model, transformers
from converter.compare.session import Options
from converter.paths import is_inside
from converter.spec import spec_from_functions
from converter.verify.run import verify

SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             num_hidden_layers=2, vocab_size=128, tie_word_embeddings=False)
# 8 experts in 4 groups, the best 2 groups, top-2, scaled by 2.5; layer 0 dense, layers 1 and 2 MoE
GROUPED = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2,
               num_experts_per_tok=2, norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=32)
ONE_BASE = {"rope_type": "default", "rope_theta": 1e6}


class Case(NamedTuple):
    hf_config: str  # transformers' config class
    hf_model: str  # transformers' causal-LM class
    paddle_model: str  # PaddleFormers' class (the one that runs without paddlefleet)
    fields: dict  # the config's fields beside SIZES
    paddle_fields: dict = {}  # fields set on PaddleFormers' config alone (what it reads under another name)


CASES = {
    "qwen3_moe": Case("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLMDeprecated",
                      dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)),
    "ernie4_5": Case("Ernie4_5Config", "Ernie4_5ForCausalLM", "Ernie4_5ForCausalLM", {}),
    "gpt_oss": Case("GptOssConfig", "GptOssForCausalLM", "GptOssForCausalLM",
                    dict(num_local_experts=4, num_experts_per_tok=2)),
    # HF reads the base per layer type, PaddleFormers from rope_theta: the same 1e6 for both
    "gemma3_text": Case("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3ForCausalLM",
                        dict(tie_word_embeddings=True, sliding_window=4,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters={"full_attention": ONE_BASE, "sliding_attention": ONE_BASE}),
                        {"rope_theta": ONE_BASE["rope_theta"]}),
    # max_position_embeddings = factor x original: both libraries read YaRN's factor as 40
    "deepseek_v3": Case("DeepseekV3Config", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM",
                        dict(GROUPED, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                             v_head_dim=16, num_key_value_heads=4, head_dim=8, max_position_embeddings=40 * 4096,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                              "original_max_position_embeddings": 4096, "mscale": 1.0,
                                              "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})),
    "glm4_moe": Case("Glm4MoeConfig", "Glm4MoeForCausalLM", "Glm4MoeForCausalLMDeprecated",
                     dict(GROUPED, use_qk_norm=True)),
}


def _config(family):
    case = CASES[family]
    return getattr(transformers, case.hf_config)(**{**SIZES, **case.fields})


def _hf(family):
    def build():
        config = _config(family)
        config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
        return hf_logits(getattr(transformers, CASES[family].hf_model), config)
    return build


def _experts_per_expert(experts):
    """PaddleFormers' GPT-OSS experts in eval mode run every expert on every token and weight the
    outputs with the routing weights reordered by `transpose([0, 1])`, the identity in paddle:
    tokens get other tokens' weights. Their per-expert path (train mode's; no dropout in it) is
    HF's computation: taken here whatever the mode."""
    forward = experts.forward

    def per_expert(hidden_states, router_indices=None, routing_weights=None):
        experts.training = True
        try:
            return forward(hidden_states, router_indices=router_indices, routing_weights=routing_weights)
        finally:
            experts.training = False
    experts.forward = per_expert


def _paddleformers(family, plant=None):
    def build():
        case = CASES[family]
        config = paddleformers_config(family, case.hf_config, _config(family))
        for name, value in case.paddle_fields.items():
            setattr(config, name, value)
        model = paddleformers_model(family, case.paddle_model, config).eval()
        if family == "gpt_oss":
            for layer in model.model.layers:
                _experts_per_expert(layer.mlp.experts)
        if plant is not None:
            plant(model)
        return model
    return build


class Bug(NamedTuple):
    """A bug planted at `path` of the paddle model, and the module it is named at."""
    kind: str  # "epsilon", "gelu" or "alpha"
    path: str
    culprit: str

    def __call__(self, model):
        import paddle
        layer = model.get_sublayer(self.path)
        if self.kind == "epsilon":  # PaddleFormers' RMSNorm holds it as variance_epsilon, Gemma 3's as eps
            setattr(layer, "eps" if hasattr(layer, "eps") else "variance_epsilon", 1e-2)
        elif self.kind == "gelu":  # an exact GELU where the model has SiLU or GELU's tanh approximation
            for name in [n for n, _ in layer.named_sublayers(include_self=True) if n.endswith("act_fn")]:
                parent, _, attr = name.rpartition(".")
                setattr(layer.get_sublayer(parent) if parent else layer, attr, paddle.nn.GELU())
        else:  # GPT-OSS' experts: the gate's sigmoid scale (HF 1.702)
            layer.alpha = 1.0

    def __repr__(self):
        return f"{self.kind}@{self.path}"


BUGS = {
    "qwen3_moe": [Bug("epsilon", "model.layers.1.post_attention_layernorm", "model.layers.1.post_attention_layernorm"),
                  Bug("epsilon", "model.layers.1.self_attn.k_norm", "model.layers.1.self_attn.k_norm"),
                  Bug("gelu", "model.layers.1.mlp.experts", "model.layers.1.mlp")],
    "ernie4_5": [Bug("epsilon", "model.layers.1.post_attention_layernorm", "model.layers.1.post_attention_layernorm"),
                 Bug("gelu", "model.layers.1.mlp", "model.layers.1.mlp.act_fn")],
    "gpt_oss": [Bug("epsilon", "model.layers.1.post_attention_layernorm", "model.layers.1.post_attention_layernorm"),
                Bug("alpha", "model.layers.1.mlp.experts", "model.layers.1.mlp.experts")],
    "gemma3_text": [Bug("epsilon", "model.layers.1.pre_feedforward_layernorm", "model.layers.1.pre_feedforward_layernorm"),
                    Bug("gelu", "model.layers.1.mlp", "model.layers.1.mlp.act_fn")],
    "deepseek_v3": [Bug("epsilon", "model.layers.2.self_attn.kv_a_layernorm", "model.layers.2.self_attn.kv_a_layernorm"),
                    Bug("gelu", "model.layers.2.mlp.shared_experts", "model.layers.2.mlp.shared_experts.act_fn"),
                    Bug("gelu", "model.layers.2.mlp.experts", "model.layers.2.mlp")],
    "glm4_moe": [Bug("epsilon", "model.layers.2.post_attention_layernorm", "model.layers.2.post_attention_layernorm"),
                 Bug("gelu", "model.layers.2.mlp.shared_experts", "model.layers.2.mlp.shared_experts.act_fn"),
                 Bug("gelu", "model.layers.2.mlp.experts", "model.layers.2.mlp")],
}


def _inputs():
    return (np.random.default_rng(0).integers(0, SIZES["vocab_size"], (2, 12)).astype("int64"),)


def _verify(family, strategy, plant=None):
    spec = spec_from_functions(_hf(family), _paddleformers(family, plant), _inputs, mapping=f"paddleformers-{family}")
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


def _over(report) -> list:
    return [(r.torch, r.ratio) for r in report.layers if r.within_budget is False]


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("family", ["qwen3_moe", "ernie4_5", "gpt_oss"])
def test_a_clean_pair_passes(family, strategy):
    report = _verify(family, strategy)
    assert report.verdict == "pass", (report.first_bad, _over(report))
    assert report.outputs is not None and report.outputs.within_budget and report.outputs.ratio < 1
    if strategy == "full":
        judged = [r.ratio for r in report.layers if r.ratio is not None]
        assert len(judged) == len(report.layers) and max(judged) < 1, max(judged)


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("family, bug", [pytest.param(family, bug, id=f"{family}-{bug!r}")
                                         for family, bugs in BUGS.items() for bug in bugs])
def test_a_planted_bug_is_named_at_its_module(family, bug, strategy):
    report = _verify(family, strategy, bug)
    assert report.verdict == "fail" and report.first_bad is not None, _over(report)
    assert report.first_bad.torch == bug.culprit, (report.first_bad.torch, _over(report))
    causes = " ".join(d.cause for d in report.diagnosis)
    if bug.kind == "epsilon" and strategy == "full":
        assert "epsilon" in causes, report.diagnosis
    if is_inside(bug.path, bug.culprit):  # the planted layer has no counterpart: its diagnosis names both sides'
        assert f"torch's {bug.path} (" in causes and f"paddle's {bug.path} (LayerList)" in causes, report.diagnosis

