"""The shipped PaddleFormers 1.2 rule sets on tiny random HF transformers 5 models (2 layers, hidden
64, 4 heads, 2 KV heads, head_dim 16, vocab 128): `convert-weights HF_DIR OUT_DIR` with no
--mapping or --target writes a directory that PaddleFormers' own plain-paddle class loads as
paddle weights; every tensor it holds after loading is the converted file's and, bit for bit,
what PaddleFormers' own loader makes of HF's checkpoint; its logits match HF's to fp32 noise.
Runs in the second side environment (scripts/side_env_paddleformers.sh); elsewhere it is skipped."""

import shutil

import numpy as np
import pytest
import torch

from helpers.cli import run_convert
from hf_paddleformers import paddleformers_class, transformers

paddleformers = pytest.importorskip("paddleformers")
import paddle  # noqa: E402

SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             num_hidden_layers=2, vocab_size=128, tie_word_embeddings=False)
# family -> (HF config class, extra config fields, PaddleFormers' plain-paddle causal-LM class)
FAMILIES = {
    "llama": ("LlamaConfig", {}, "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", {}, "Qwen2ForCausalLMDeprecated"),
    "qwen3": ("Qwen3Config", {}, "Qwen3ForCausalLMDeprecated"),
    "phi3": ("Phi3Config", {"pad_token_id": 0}, "Phi3ForCausalLM"),
    "ernie4_5": ("Ernie4_5Config", {}, "Ernie4_5ForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "shared_expert_intermediate_size": 48}, "Qwen2MoeForCausalLMDeprecated"),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
                  "Qwen3MoeForCausalLMDeprecated"),
    # Gemma 3 ties its head (PaddleFormers' own loader always takes the head from the embeddings);
    # one rotary base for both layer types (PaddleFormers builds one table, from rope_theta, which
    # convert-weights writes: PaddleFormers' default 1e6 would be used otherwise), a window shorter than the input
    "gemma3_text": ("Gemma3TextConfig", {"tie_word_embeddings": True, "sliding_window": 4,
                                         "layer_types": ["sliding_attention", "full_attention"],
                                         "rope_parameters": {t: {"rope_type": "default", "rope_theta": 10000.0}
                                                             for t in ("full_attention", "sliding_attention")}},
                    "Gemma3ForCausalLM"),
    # PaddleFormers' attention reads rope_parameters["factor"]: DeepSeek-V3's own YaRN settings, with its
    # max_position_embeddings (factor x original): PaddleFormers takes YaRN's factor from that ratio, HF 5
    # from `factor` (test_verify_divergences.py)
    "deepseek_v3": ("DeepseekV3Config", {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                         "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "q_lora_rank": 32,
                                         "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                                         "v_head_dim": 16, "num_key_value_heads": 4, "head_dim": 8, "max_position_embeddings": 40 * 4096,
                                         "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                                             "original_max_position_embeddings": 4096, "mscale": 1.0,
                                                             "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}},
                    "DeepseekV3ForCausalLM"),
    # a dense first layer, a shared expert, the grouped router with its score-correction bias;
    # HF's default partial rotary factor (0.5) and q/k norms
    "glm4_moe": ("Glm4MoeConfig", {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                   "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "use_qk_norm": True},
                 "Glm4MoeForCausalLMDeprecated"),
    # attention sinks, biases, stacked experts as HF holds them; HF's default YaRN rotary settings
    "gpt_oss": ("GptOssConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}, "GptOssForCausalLM"),
}
MOE = {"qwen2_moe", "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss"}
# Families whose logits are compared with the model in train mode (no dropout in these configs):
# PaddleFormers' GPT-OSS experts in eval mode give tokens other tokens' routing weights
# (tests/real_models_paddleformers/test_verify_divergences.py); its per-expert train-mode path does not.
TRAIN_MODE = {"gpt_oss"}
NOISE_FACTOR = 4  # |PaddleFormers - HF fp32| may be this many times HF's own fp32 error (|HF fp32 - HF fp64|)


def _hf_model(family: str, directory):
    config_class, extra, _ = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**SIZES, **extra})
    eager = {"experts_implementation": "eager"} if family in MOE else {}  # grouped_mm has no float64 kernel
    model = transformers.AutoModelForCausalLM.from_config(config, **eager).eval()
    model.save_pretrained(directory)
    return model


def _logits_pf(model, ids: np.ndarray, train_mode: bool = False) -> np.ndarray:
    model.config.fuse_rms_norm = False  # paddle 3.3.1 has no CPU kernel for the fused RMSNorm
    model.train() if train_mode else model.eval()
    with paddle.no_grad():
        out = model(input_ids=paddle.to_tensor(ids))
    return (out.logits if hasattr(out, "logits") else out[0]).numpy().astype(np.float64)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_directory_loads_into_paddleformers_as_its_own_loader_makes_it(tmp, family):
    from converter.io.pdparams import load_pdparams
    hf = _hf_model(family, tmp / "hf")
    r = run_convert(tmp / "hf", tmp / "out", "--quiet")
    assert r.code == 0, r
    assert f"mapping: 'paddleformers-{family}' for PaddleFormers 1.2" in r.stderr
    ours = load_pdparams(str(tmp / "out" / "model_state.pdparams"))

    cls = paddleformers_class(family, FAMILIES[family][2])
    shutil.copytree(tmp / "hf", tmp / "hf-copy")  # PaddleFormers' own loader writes its metadata there
    reference = {k: v.numpy() for k, v in cls.from_pretrained(str(tmp / "hf-copy")).state_dict().items()}
    model = cls.from_pretrained(str(tmp / "out"), load_checkpoint_format=None, convert_from_hf=False)
    loaded = {k: v.numpy() for k, v in model.state_dict().items()}
    if "lm_head.weight" not in ours:  # a tied head PaddleFormers ties itself: the embeddings' parameter
        assert model.lm_head.weight is model.get_input_embeddings().weight
        ours["lm_head.weight"] = ours["model.embed_tokens.weight"]
    assert sorted(loaded) == sorted(ours) == sorted(reference)
    for name, array in ours.items():
        assert array.dtype == loaded[name].dtype == reference[name].dtype, name
        assert np.array_equal(loaded[name], array), f"{name}: PaddleFormers did not take the converted tensor"
        assert np.array_equal(array, reference[name]), f"{name}: differs from PaddleFormers' own conversion"

    ids = np.random.default_rng(0).integers(0, SIZES["vocab_size"], size=(2, 12))
    with torch.no_grad():
        hf32 = hf(torch.from_numpy(ids)).logits.double().numpy()
        hf64 = hf.double()(torch.from_numpy(ids)).logits.numpy()
    pf = _logits_pf(model, ids, train_mode=family in TRAIN_MODE)
    difference, noise = np.abs(pf - hf32).max(), np.abs(hf32 - hf64).max()
    print(f"{family}: max |PaddleFormers - HF fp32| {difference:.2e}, |HF fp32 - HF fp64| {noise:.2e}")
    assert 0 < noise < 1e-4 and difference <= NOISE_FACTOR * noise, (difference, noise)


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_weights_file_alone_is_detected_for_paddleformers(tmp, family):
    """Families without a merge by groups need no config.json: the file alone is detected and
    written as the directory's weights are."""
    from converter.io.pdparams import load_pdparams
    _hf_model(family, tmp / "hf")
    shutil.copy(tmp / "hf" / "model.safetensors", tmp / "model.safetensors")
    r = run_convert(tmp / "model.safetensors", tmp / "file.pdparams", "--quiet")
    assert r.code == 0, r
    assert f"mapping: detected 'paddleformers-{family}' for PaddleFormers 1.2" in r.stderr
    d = run_convert(tmp / "hf", tmp / "out", "--quiet")
    assert d.code == 0, d
    alone, directory = load_pdparams(str(tmp / "file.pdparams")), load_pdparams(str(tmp / "out" / "model_state.pdparams"))
    assert sorted(alone) == sorted(directory) and all(np.array_equal(alone[k], directory[k]) for k in alone)


def test_weights_file_of_a_fused_family_names_the_config_field_it_lacks(tmp):
    _hf_model("qwen2", tmp / "hf")
    shutil.copy(tmp / "hf" / "model.safetensors", tmp / "model.safetensors")
    r = run_convert(tmp / "model.safetensors", tmp / "file.pdparams", "--quiet", "--target", "paddleformers")
    assert r.code == 2 and not (tmp / "file.pdparams").exists()
    assert "num_key_value_heads" in r.stderr and "Traceback" not in r.stderr
