"""verify-port on an HF 5 mixture-of-experts model against PaddleFormers 1.2: a tiny random
Qwen2-MoE (4 experts, top-2, a shared expert) through the shipped rule set
paddleformers-qwen2_moe, whose fused q|k|v groups are read from the HF model's own config. HF's
router returns the softmax and the top-k weights, PaddleFormers' gate its logits: compared by
what they mean, the clean pair passes under both strategies, and a gate whose logits are off is
named at the gate. Runs in the second side environment (scripts/side_env_paddleformers.sh)."""

import numpy as np
import pytest

from hf_paddleformers import hf_logits, paddleformers_class, paddleformers_model, transformers
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

CONFIG = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, num_hidden_layers=2,
              vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
              decoder_sparse_step=1, norm_topk_prob=False)


def _hf():
    return hf_logits(transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(**CONFIG))


def _paddleformers(scaled_gate=False):
    def build():
        config = paddleformers_class("qwen2_moe", "Qwen2MoeConfig")(**CONFIG)
        config.pad_token_id = None
        model = paddleformers_model("qwen2_moe", "Qwen2MoeForCausalLMDeprecated", config)
        if scaled_gate:
            gate = model.model.layers[1].mlp.gate
            forward = gate.forward
            gate.forward = lambda x: forward(x) * 1.5  # a router temperature HF's model does not have
        return model
    return build


def _inputs():
    return (np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (2, 16)).astype("int64"),)


def _verify(paddle_model, strategy):
    spec = spec_from_functions(_hf, paddle_model, _inputs, mapping="paddleformers-qwen2_moe")
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_clean_qwen2_moe_pair_passes_with_its_routers_compared_by_meaning(strategy):
    report = _verify(_paddleformers(), strategy)
    assert report.verdict == "pass", (report.first_bad, report.notes[:3])
    routers = [r for r in report.layers if r.torch.endswith("mlp.gate")]
    assert routers and all(r.ratio is not None and r.ratio < 0.6 for r in routers), routers
    assert report.outputs is not None and report.outputs.within_budget


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_gate_whose_logits_are_off_is_named_at_the_gate(strategy):
    report = _verify(_paddleformers(scaled_gate=True), strategy)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "model.layers.1.mlp.gate", report.first_bad
