"""A merge by groups writes PaddleFormers' fused q|k|v exactly as PaddleFormers 1.2 builds it
itself from an HF transformers 5 checkpoint (its flex-checkpoint loader, `fused_qkv`). Runs in
the second side environment (scripts/side_env_paddleformers.sh); elsewhere it is skipped."""

import json

import numpy as np
import pytest

from helpers.cli import run_convert

from hf_paddleformers import paddleformers_class, torch, transformers  # noqa: E402  (skips where the side environment is not installed)
paddleformers = pytest.importorskip("paddleformers")

RULES = [
    {"kind": "merge", "match": ["(.*)\\.q_proj\\.(weight|bias)", "(.*)\\.k_proj\\.(weight|bias)",
                                "(.*)\\.v_proj\\.(weight|bias)"], "to": "\\1.qkv_proj.\\2", "axis": -1,
     "groups": "num_key_value_heads"},
    {"kind": "merge", "match": ["(.*)\\.gate_proj\\.weight", "(.*)\\.up_proj\\.weight"], "to": "\\1.up_gate_proj.weight",
     "axis": 1},
    {"kind": "transpose", "match": ".*_proj\\.weight"},
]


def _paddleformers_qwen2(directory):
    """PaddleFormers' Qwen2 loaded from the HF directory by PaddleFormers itself. Its modeling file
    imports paddlefleet's GPT provider at the top; the plain-paddle class needs none of it."""
    Qwen2ForCausalLMDeprecated = paddleformers_class("qwen2", "Qwen2ForCausalLMDeprecated")
    model = Qwen2ForCausalLMDeprecated.from_pretrained(str(directory))
    return {k: v.numpy() for k, v in model.state_dict().items()}


def test_hf_and_paddleformers_llama_classes_import_in_one_process():
    from paddleformers.transformers.llama.modeling import LlamaForCausalLM as PaddleLlama
    from transformers import LlamaForCausalLM
    assert transformers.__version__.startswith("5.")
    assert LlamaForCausalLM.__module__.startswith("transformers.") and PaddleLlama.__name__ == "LlamaForCausalLM"


def test_grouped_merge_is_paddleformers_fused_qkv(tmp):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from converter.rules.plan import build_plan
    from converter.rules.ruleset import parse_ruleset
    from converter.io.base import TensorInfo
    from safetensors.numpy import load_file

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         num_hidden_layers=2, vocab_size=128)
    Qwen2ForCausalLM(config).save_pretrained(tmp / "hf")
    hf = load_file(str(tmp / "hf" / "model.safetensors"))
    fused_keys = [k for k in hf if "_proj" in k and ".o_proj." not in k and ".down_proj." not in k]
    arrays = {k: hf[k] for k in fused_keys}
    params = json.loads((tmp / "hf" / "config.json").read_text())
    assert params["num_key_value_heads"] == 2 and params["num_attention_heads"] == 4
    ruleset = parse_ruleset({"name": "qwen2-fused", "rules": RULES}, "qwen2-fused").with_params(params)
    plan = build_plan({k: TensorInfo(k, str(v.dtype), v.shape) for k, v in arrays.items()}, ruleset)
    ours = {e.name: e.compute(lambda k: arrays[k]) for e in plan.entries}

    theirs = _paddleformers_qwen2(tmp / "hf")
    assert sorted(ours) == sorted(k for k in theirs if "qkv_proj" in k or "up_gate_proj" in k)
    for name, array in ours.items():
        assert array.dtype == theirs[name].dtype and np.array_equal(array, theirs[name]), name
    q, k = hf["model.layers.1.self_attn.q_proj.weight"], hf["model.layers.1.self_attn.k_proj.weight"]
    plain = np.concatenate([q, k, hf["model.layers.1.self_attn.v_proj.weight"]]).T
    assert not np.array_equal(plain, theirs["model.layers.1.self_attn.qkv_proj.weight"])  # two KV heads: not a concatenation

    # the command, on the file (no config beside it: the number written in the rule)
    rules = [dict(RULES[0], groups=2)] + RULES[1:] + [{"kind": "drop", "match": ".*\\.(o_proj|down_proj)\\.weight|"
                                                                              "model\\.(embed_tokens|norm)\\..*|lm_head\\..*|.*layernorm.*"}]
    (tmp / "rules.json").write_text(json.dumps({"name": "qwen2-fused", "rules": rules}))
    r = run_convert(tmp / "hf" / "model.safetensors", tmp / "fused.safetensors", "--mapping", tmp / "rules.json")
    assert r.code == 0, r
    written = load_file(str(tmp / "fused.safetensors"))
    assert sorted(written) == sorted(ours)
    assert all(np.array_equal(written[k], theirs[k]) for k in written)
