"""verify-port on HF transformers 5 against PaddleFormers 1.2: tiny random Llama, Qwen2, Qwen3 and
Phi3 causal LMs (two KV heads, so PaddleFormers' fused q|k|v is interleaved per KV group) pass clean with
--bisect under both strategies, HF's side with use_cache=True (a DynamicCache its layers extend);
planted bugs (key heads exchanged inside the fused q|k|v, an RMSNorm epsilon, SiLU -> GELU) are
named at their module under both strategies; an HF 5 MoE model's float64 copy runs its experts
eagerly. Runs in the second side environment (scripts/side_env_paddleformers.sh); elsewhere it
is skipped."""

import json

import numpy as np
import pytest

from hf_paddleformers import stand_ins, torch, transformers  # noqa: E402  (skips where the side environment is not installed)
paddleformers = pytest.importorskip("paddleformers")
import paddle  # noqa: E402

from converter.compare.session import Options  # noqa: E402
from converter.spec import spec_from_functions  # noqa: E402
from converter.verify.run import verify  # noqa: E402

CONFIG = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, num_hidden_layers=2,
              vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)
HEAD, GROUP = 16, 2  # head size; query heads per KV head
QWEN2_RULES = {"name": "paddleformers-qwen2", "unmatched": "keep", "rules": [
    {"kind": "merge", "match": [r"(.*)\.q_proj\.(weight|bias)", r"(.*)\.k_proj\.(weight|bias)", r"(.*)\.v_proj\.(weight|bias)"],
     "to": r"\1.qkv_proj.\2", "axis": -1, "groups": CONFIG["num_key_value_heads"]},
    {"kind": "merge", "match": [r"(.*)\.gate_proj\.weight", r"(.*)\.up_proj\.weight"], "to": r"\1.up_gate_proj.weight",
     "axis": 1},
    {"kind": "transpose", "match": r".*_proj\.weight"},
]}


def _logits_only(cls):
    """HF's causal LM returning its logits alone (PaddleFormers' returns no cache), with use_cache=True:
    its layers extend a DynamicCache the model makes."""
    class Logits(cls):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=True).logits
    return Logits


def _hf(family):
    def build():
        torch.manual_seed(0)
        config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                 "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                                 "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
                                 "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM)}[family]
        return _logits_only(model_cls)(config_cls(**_config(family))).eval()
    return build


def _config(family) -> dict:
    if family == "qwen3":
        return dict(CONFIG, head_dim=HEAD)
    if family == "phi3":
        return dict(CONFIG, pad_token_id=None)  # HF's Phi3Config says 32000, past this vocabulary
    return CONFIG


def _paddleformers_classes(family):
    stand_ins()  # the modeling files of qwen2 and qwen3 import paddlefleet's
    if family == "llama":
        from paddleformers.transformers.llama.modeling import LlamaConfig, LlamaForCausalLM
        return LlamaConfig, LlamaForCausalLM
    if family == "qwen2":
        from paddleformers.transformers.qwen2.modeling import Qwen2Config, Qwen2ForCausalLMDeprecated
        return Qwen2Config, Qwen2ForCausalLMDeprecated
    if family == "qwen3":
        from paddleformers.transformers.qwen3.modeling import Qwen3Config, Qwen3ForCausalLMDeprecated
        return Qwen3Config, Qwen3ForCausalLMDeprecated
    from paddleformers.transformers.phi3.modeling import Phi3Config, Phi3ForCausalLM
    return Phi3Config, Phi3ForCausalLM


def _paddleformers(family, bug=None):
    def build():
        config_cls, model_cls = _paddleformers_classes(family)
        config = config_cls(**_config(family))
        config.fuse_rms_norm = False  # paddle 3.3.1 has no CPU kernel for the fused norm
        config.pad_token_id = None  # PaddleFormers' default 0 makes row 0 of the embedding a padding row; HF's is None
        config.use_cache = False  # PaddleFormers' Qwen2 would return its cache beside the logits
        model = model_cls(config)
        layer = model.model.layers[1]
        if bug == "epsilon":
            layer.post_attention_layernorm.variance_epsilon = 1e-2
        elif bug == "gelu":
            layer.mlp.act_fn = paddle.nn.GELU()
        return model
    return build


def inputs():
    return {"input_ids": np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (2, 12)).astype(np.int64)}


@pytest.fixture(scope="module")
def qwen2_rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "qwen2.json"
    path.write_text(json.dumps(QWEN2_RULES))
    return str(path)


def _verify(family, rules, bug=None, strategy="full", converted=None):
    spec = spec_from_functions(_hf(family), _paddleformers(family, bug), inputs, mapping=rules, label=bug or "clean")
    return verify(spec, Options(device="cpu", strategy=strategy), converted=converted, bisect=True)


def _mapping(family, qwen2_rules):
    """qwen2 and qwen3: q|k|v merged by groups, gate|up concatenated; llama and phi3 (HF's fused
    qkv_proj and gate_up_proj in PaddleFormers' order already): inferred, every Linear transposed and
    LMHead's weight kept as it is."""
    return qwen2_rules if family in ("qwen2", "qwen3") else None


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "phi3"])
def test_a_clean_pair_passes(family, strategy, qwen2_rules):
    report = _verify(family, _mapping(family, qwen2_rules), strategy=strategy)
    assert report.verdict == "pass", [(r.torch, r.ratio, r.note) for r in report.layers if r.within_budget is False]
    assert report.outputs.within_budget and report.outputs.ratio < 1
    rows = {r.torch: r for r in report.layers}
    if strategy == "full":
        judged = [r.ratio for r in report.layers if r.ratio is not None]
        assert len(judged) == len(report.layers) and max(judged) < 1, max(judged)
        assert rows["lm_head"].paddle_type == "LMHead"
        if family in ("qwen2", "qwen3"):  # each projection judged on its own positions of the fused layers
            for name in ("q_proj", "k_proj", "v_proj"):
                row = rows[f"model.layers.1.self_attn.{name}"]
                assert row.paddle == "model.layers.1.self_attn.qkv_proj" and "in 2 groups" in row.note, row
            for name in ("gate_proj", "up_proj"):
                assert rows[f"model.layers.1.mlp.{name}"].paddle == "model.layers.1.mlp.up_gate_proj"


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("family, bug, culprit", [
    ("llama", "epsilon", "model.layers.1.post_attention_layernorm"),
    ("llama", "gelu", "model.layers.1.mlp.act_fn"),
    ("qwen2", "epsilon", "model.layers.1.post_attention_layernorm"),
    ("qwen2", "gelu", "model.layers.1.mlp.act_fn"),
    ("qwen3", "gelu", "model.layers.1.mlp.act_fn"),
    ("phi3", "epsilon", "model.layers.1.post_attention_layernorm"),
])
def test_a_planted_bug_is_named_at_its_module(family, bug, culprit, strategy, qwen2_rules):
    report = _verify(family, _mapping(family, qwen2_rules), bug, strategy)
    assert report.verdict == "fail" and report.first_bad is not None
    assert report.first_bad.torch == culprit, [(r.torch, r.ratio) for r in report.layers if r.within_budget is False]
    if bug == "epsilon" and strategy == "full":
        assert "epsilon" in " ".join(d.cause for d in report.diagnosis), report.diagnosis


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_key_heads_exchanged_inside_the_fused_qkv_are_named_at_k_proj(strategy, qwen2_rules, tmp_path):
    from converter.inmemory import convert_in_memory
    from converter.io.base import TensorInfo
    from converter.io.pdparams import write_pdparams
    state = convert_in_memory(_hf("qwen2")(), _paddleformers("qwen2")(), qwen2_rules)[0]
    block = (GROUP + 2) * HEAD
    k0, k1 = (slice(g * block + GROUP * HEAD, g * block + (GROUP + 1) * HEAD) for g in range(2))
    for key in ("model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.self_attn.qkv_proj.bias"):
        w = state[key].copy()
        w[..., k0], w[..., k1] = state[key][..., k1], state[key][..., k0]
        state[key] = w
    path = tmp_path / "k_heads.pdparams"
    with open(path, "wb") as f:
        write_pdparams(f, [TensorInfo(k, "float32", v.shape) for k, v in state.items()], lambda info: state[info.name])
    report = _verify("qwen2", qwen2_rules, strategy=strategy, converted=str(path))
    assert report.verdict == "fail" and report.first_bad.torch == "model.layers.1.self_attn.k_proj", report.first_bad
    rows = {r.torch: r for r in report.layers}
    assert rows["model.layers.1.self_attn.q_proj"].within_budget and rows["model.layers.1.self_attn.v_proj"].within_budget


def test_the_float64_copy_of_an_hf5_moe_model_runs_its_experts_eagerly():
    from converter.compare.replay import float64_kernels
    from converter.frameworks import torch_side
    config = transformers.Qwen3MoeConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                         num_experts_per_tok=2, num_hidden_layers=2, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    ids = torch.from_numpy(inputs()["input_ids"])
    with pytest.raises(Exception, match="Double"):  # grouped_mm, HF 5's default, has no float64 kernel
        torch_side.float64_copy(model)(ids)
    wide = float64_kernels(torch_side.float64_copy(model))
    with torch.no_grad():
        drift = (model(ids).logits.double() - wide(ids).logits).abs().max().item()
    assert model.config._experts_implementation == "grouped_mm" and wide.config._experts_implementation == "eager"
    assert 0 < drift < 1e-5
