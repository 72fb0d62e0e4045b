"""HF config.json -> PaddleNLP 2.8.1 config.json, field by field, for every family.

Each HF config below is what HF 4.44 writes for a model of that family (save_pretrained of a
hub-like config); each expected config uses the field names PaddleNLP 2.8.1's config class and
modeling read (scripts/check_mappings_paddlenlp.py builds PaddleNLP's models from these
translations and compares their outputs with HF's)."""

import pytest

from converter.errors import UserError
from converter.hfconfig import FAMILIES, translate_config

COMMON = {"transformers_version": "4.44.2", "torch_dtype": "float32", "_name_or_path": "x"}

CASES = {
    "bert": ({"architectures": ["BertForSequenceClassification"], "model_type": "bert", "attention_probs_dropout_prob": 0.1,
              "classifier_dropout": None, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
              "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
              "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
              "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522, "id2label": {"0": "a", "1": "b"},
              "label2id": {"a": 0, "b": 1}},
             {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "attention_probs_dropout_prob": 0.1,
              "classifier_dropout": None, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
              "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
              "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2, "use_cache": True,
              "vocab_size": 30522, "id2label": {"0": "a", "1": "b"}, "label2id": {"a": 0, "b": 1}, "dtype": "float32"}),
    "roberta": ({"architectures": ["RobertaForMaskedLM"], "model_type": "roberta", "attention_probs_dropout_prob": 0.1,
                 "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
                 "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
                 "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "type_vocab_size": 1,
                 "vocab_size": 50265},
                {"architectures": ["RobertaForMaskedLM"], "model_type": "roberta", "attention_probs_dropout_prob": 0.1,
                 "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
                 "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
                 "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "type_vocab_size": 1,
                 "vocab_size": 50265, "dtype": "float32"}),
    "electra": ({"architectures": ["ElectraForPreTraining"], "model_type": "electra", "embedding_size": 128,
                 "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "num_hidden_layers": 12,
                 "hidden_act": "gelu", "summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu",
                 "summary_last_dropout": 0.1, "position_embedding_type": "absolute", "type_vocab_size": 2,
                 "layer_norm_eps": 1e-12, "vocab_size": 30522},
                {"architectures": ["ElectraDiscriminator"], "model_type": "electra", "embedding_size": 128,
                 "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "num_hidden_layers": 12,
                 "hidden_act": "gelu", "type_vocab_size": 2, "layer_norm_eps": 1e-12, "vocab_size": 30522,
                 "dtype": "float32"}),
    "deberta-v2": ({"architectures": ["DebertaV2ForSequenceClassification"], "model_type": "deberta-v2",
                    "attention_head_size": 64, "attention_probs_dropout_prob": 0.1, "conv_act": "gelu", "conv_kernel_size": 3,
                    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 1536, "initializer_range": 0.02,
                    "intermediate_size": 6144, "layer_norm_eps": 1e-07, "max_position_embeddings": 512,
                    "max_relative_positions": -1, "norm_rel_ebd": "layer_norm", "num_attention_heads": 24,
                    "num_hidden_layers": 24, "pad_token_id": 0, "pooler_dropout": 0, "pooler_hidden_act": "gelu",
                    "pooler_hidden_size": 1536, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
                    "position_buckets": 256, "relative_attention": True, "share_att_key": True, "type_vocab_size": 0,
                    "vocab_size": 128100},
                   {"architectures": ["DebertaV2ForSequenceClassification"], "model_type": "deberta-v2",
                    "attention_head_size": 64, "attention_probs_dropout_prob": 0.1, "conv_kernel_size": 3,
                    "hidden_dropout_prob": 0.1, "hidden_size": 1536, "initializer_range": 0.02,
                    "intermediate_size": 6144, "layer_norm_eps": 1e-07, "max_position_embeddings": 512,
                    "max_relative_positions": -1, "norm_rel_ebd": "layer_norm", "num_attention_heads": 24,
                    "num_hidden_layers": 24, "pad_token_id": 0, "pooler_dropout": 0, "pooler_hidden_act": "gelu",
                    "pooler_hidden_size": 1536, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
                    "position_buckets": 256, "relative_attention": True, "share_att_key": True, "share_attn_key": True,
                    "type_vocab_size": 0, "vocab_size": 128100, "output_hidden_states": False, "dtype": "float32"}),
    "gpt2": ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
              "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
              "layer_norm_epsilon": 1e-05, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None, "n_layer": 12,
              "n_positions": 1024, "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
              "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "summary_activation": None,
              "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
              "summary_use_proj": True, "use_cache": True, "vocab_size": 50257},
             {"architectures": ["GPTForCausalLM"], "model_type": "gpt", "hidden_activation": "gelu",
              "attention_probs_dropout_prob": 0.1, "bos_token_id": 50256, "eos_token_id": 50256, "initializer_range": 0.02,
              "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "num_hidden_layers": 12,
              "max_position_embeddings": 1024, "hidden_dropout_prob": 0.1, "use_cache": True, "vocab_size": 50257,
              "dtype": "float32"}),
    "llama": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
               "intermediate_size": 11008, "max_position_embeddings": 4096, "mlp_bias": False, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
               "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False, "use_cache": True,
               "vocab_size": 32000},
              {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
               "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
               "rope_theta": 10000.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32000,
               "dtype": "float32"}),
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "attention_dropout": 0.0, "bos_token_id": 1,
                 "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                 "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
                 "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                 "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                 "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0, "sliding_window": None,
                 "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32000},
                {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "attention_dropout": 0.0, "bos_token_id": 1,
                 "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                 "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
                 "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                 "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                 "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
                 "vocab_size": 32000, "dtype": "float32"}),
    "t5": ({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_ff": 2048, "d_kv": 64, "d_model": 768,
            "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1, "eos_token_id": 1,
            "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True, "is_gated_act": True,
            "layer_norm_epsilon": 1e-06, "num_decoder_layers": 12, "num_heads": 12, "num_layers": 12, "pad_token_id": 0,
            "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32, "tie_word_embeddings": False,
            "use_cache": True, "vocab_size": 32128},
           {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_ff": 2048, "d_kv": 64, "d_model": 768,
            "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu",
            "initializer_factor": 1.0, "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "num_decoder_layers": 12,
            "num_heads": 12, "num_layers": 12, "pad_token_id": 0,
            "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32128,
            "dtype": "float32"}),
    "opt": ({"architectures": ["OPTForCausalLM"], "model_type": "opt", "_remove_final_layer_norm": False,
             "activation_function": "relu", "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": False,
             "dropout": 0.1, "enable_bias": True, "eos_token_id": 2, "ffn_dim": 4096, "hidden_size": 1024, "init_std": 0.02,
             "layer_norm_elementwise_affine": True, "layerdrop": 0.0, "max_position_embeddings": 2048,
             "num_attention_heads": 16, "num_hidden_layers": 24, "pad_token_id": 1, "use_cache": True, "vocab_size": 50272,
             "word_embed_proj_dim": 512},
            {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_act": "relu",
             "attention_probs_dropout_prob": 0.0, "bos_token_id": 2, "normalize_before": False, "hidden_dropout_prob": 0.1,
             "enable_bias": True, "eos_token_id": 2, "intermediate_size": 4096, "hidden_size": 1024,
             "initializer_range": 0.02, "max_position_embeddings": 2048, "num_attention_heads": 16,
             "num_hidden_layers": 24, "pad_token_id": 1, "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 512,
             "dtype": "float32"}),
    "bloom": ({"architectures": ["BloomForCausalLM"], "model_type": "bloom", "apply_residual_connection_post_layernorm": False,
               "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True, "bos_token_id": 1,
               "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024, "initializer_range": 0.02,
               "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True, "n_head": 16, "n_inner": None, "n_layer": 24,
               "offset_alibi": 100, "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": True,
               "skip_bias_add_qkv": False, "slow_but_exact": False, "unk_token_id": 0, "use_cache": True,
               "vocab_size": 250880},
              {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "apply_residual_connection_post_layernorm": False,
               "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bos_token_id": 1, "eos_token_id": 2,
               "hidden_dropout": 0.0, "hidden_size": 1024, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
               "masked_softmax_fusion": True, "n_head": 16, "n_layer": 24, "pad_token_id": 3, "pretraining_tp": 1,
               "slow_but_exact": False, "use_cache": True, "vocab_size": 250880, "dtype": "float32"}),
}


@pytest.mark.parametrize("family", sorted(CASES))
def test_each_field_is_said_in_paddlenlp_names(family):
    hf, expected = CASES[family]
    got = translate_config({**hf, **COMMON})
    assert got.family is FAMILIES[family]
    assert got.config == expected
    assert got.notes == [n for n in got.notes if n.startswith("left out '")]
    left_out = {n.split("'")[1] for n in got.notes}
    assert {"transformers_version", "_name_or_path"} <= left_out


def test_every_family_is_covered():
    assert sorted(CASES) == sorted(FAMILIES)


@pytest.mark.parametrize("family,field,value,words", [
    ("bert", "position_embedding_type", "relative_key", "always behaves as 'absolute'"),
    ("bert", "hidden_act", "gelu_new", "'gelu_new' has no PaddleNLP counterpart"),
    ("gpt2", "activation_function", "gelu", "it takes 'gelu_new', 'gelu_pytorch_tanh'"),
    ("gpt2", "layer_norm_epsilon", 1e-6, "always behaves as 1e-05"),
    ("llama", "rope_scaling", {"type": "linear", "factor": 2.0}, "'rope_scaling'"),
    ("llama", "hidden_act", "gelu", "always behaves as 'silu'"),
    ("deberta-v2", "conv_act", "tanh", "always behaves as 'gelu'"),
    ("t5", "feed_forward_proj", "gelu", "'feed_forward_proj': 'gelu' has no PaddleNLP counterpart"),
    ("t5", "relative_attention_max_distance", 16, "always behaves as 128"),
    ("opt", "activation_function", "gelu", "'activation_function': 'gelu'"),
    ("mixtral", "router_jitter_noise", 0.1, "'router_jitter_noise'"),
    ("roberta", "architectures", ["RobertaForNothing"], "'RobertaForNothing' has no PaddleNLP class"),
    ("electra", "some_new_field", 1, "'some_new_field' has no PaddleNLP counterpart"),
])
def test_a_field_without_counterpart_is_named_unless_forced(family, field, value, words):
    hf = dict(CASES[family][0], **{field: value})
    with pytest.raises(UserError) as info:
        translate_config(hf)
    assert "pass --force" in info.value.message
    assert any(words in d for d in info.value.details), info.value.details
    forced = translate_config(hf, force=True)
    if field != "architectures":
        assert forced.config[field] == value  # copied unchanged
    assert any(n.startswith("--force: ") for n in forced.notes)


def test_deberta_conv_act_left_to_hf_default_is_an_error():
    """HF's default after the conv layer is tanh; PaddleNLP always applies GELU (a difference of 0.83)."""
    hf = {k: v for k, v in CASES["deberta-v2"][0].items() if k != "conv_act"}
    with pytest.raises(UserError) as info:
        translate_config(hf)
    assert any("'conv_act' is not given" in d for d in info.value.details)


def test_gpt2_embedding_dropout_must_match_the_residual_one():
    hf = dict(CASES["gpt2"][0], embd_pdrop=0.0)
    with pytest.raises(UserError) as info:
        translate_config(hf)
    assert any("'embd_pdrop'" in d for d in info.value.details)


def test_unknown_model_type_says_what_to_do():
    with pytest.raises(UserError, match="model_type 'whisper' is not one this tool translates .* --mapping"):
        translate_config({"model_type": "whisper"})
