"""HF `config.json` -> PaddleNLP 2.8.1 `config.json`, field by field.

Each family says, for every field an HF config of that family writes, what PaddleNLP
calls it (`renames`), which values it understands (`values`), which values it always
behaves as without a field to say so (`implied`: written by HF, not by us), and which
fields it takes under the same name (`same`). A field that fits none of these has no
counterpart: that is an error naming it, unless `force`, which copies it unchanged.
The facts come from PaddleNLP 2.8.1's configuration and modeling code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UserError

# Fields PaddleNLP's PretrainedConfig takes under HF's name (generation and label settings, ids).
BASE_SAME = frozenset({
    "add_cross_attention", "bad_words_ids", "bos_token_id", "chunk_size_feed_forward", "classifier_dropout",
    "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "eos_token_id", "exponential_decay_length_penalty", "finetuning_task",
    "forced_bos_token_id", "forced_eos_token_id", "id2label", "is_decoder", "is_encoder_decoder", "label2id",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "pad_token_id", "prefix",
    "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
    "return_dict_in_generate", "sep_token_id", "task_specific_params", "temperature", "tie_encoder_decoder",
    "tie_word_embeddings", "tokenizer_class", "top_k", "top_p", "typical_p", "use_cache",
})
# HF's own bookkeeping: says nothing about the model's computation.
BOOKKEEPING = frozenset({"_name_or_path", "transformers_version", "torchscript", "use_bfloat16", "tf_legacy_loss",
                         "gradient_checkpointing", "_commit_hash", "_attn_implementation_autoset"})
BASE_IMPLIED = {"begin_suppress_tokens": (None,), "suppress_tokens": (None,)}
BASE_RENAMES = {"torch_dtype": "dtype"}

BERT_ACT = {a: a for a in ("gelu", "relu", "tanh", "silu", "sigmoid")}  # paddle.nn.functional by name; gelu is erf
TANH_GELU = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}  # families whose "gelu" is the tanh form


@dataclass(frozen=True)
class Family:
    model_type: str  # PaddleNLP's
    mapping: str  # the shipped rule set
    classes: dict[str, str]  # HF architecture -> PaddleNLP class
    same: frozenset = frozenset()
    renames: dict[str, str] = field(default_factory=dict)
    values: dict[str, dict] = field(default_factory=dict)  # HF field -> {HF value: PaddleNLP value}
    implied: dict[str, tuple] = field(default_factory=dict)  # HF field -> the values PaddleNLP always behaves as
    ignored: frozenset = frozenset()  # fields HF's own modeling does not read either
    tied_head: str | None = None  # a source key to leave out when tie_word_embeddings is true
    checked: frozenset = frozenset()  # fields judged together with others (see _family_rules)


def _same_names(*names):
    return {n: n for n in names}


BERT_LIKE_SAME = frozenset({"attention_probs_dropout_prob", "hidden_dropout_prob", "hidden_size", "initializer_range",
                            "intermediate_size", "layer_norm_eps", "max_position_embeddings", "num_attention_heads",
                            "num_hidden_layers", "type_vocab_size", "vocab_size"})
ELECTRA_SUMMARY = {"summary_type": ("first",), "summary_use_proj": (True,), "summary_activation": ("gelu",),
                   "summary_last_dropout": (0.1,)}
GPT2_SUMMARY = {"summary_type": ("cls_index",), "summary_use_proj": (True,), "summary_activation": (None,),
                "summary_proj_to_labels": (True,), "summary_first_dropout": (0.1,)}


def _heads(prefix: str, *heads: str) -> dict[str, str]:
    """HF classes that PaddleNLP names the same way."""
    return {f"{prefix}{h}": f"{prefix}{h}" for h in heads}


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "bert", _heads("Bert", "Model", "ForSequenceClassification", "ForTokenClassification",
                                          "ForQuestionAnswering", "ForMaskedLM", "ForPreTraining", "ForMultipleChoice"),
                   BERT_LIKE_SAME, values={"hidden_act": BERT_ACT}, implied={"position_embedding_type": ("absolute",)}),
    "roberta": Family("roberta", "roberta", _heads("Roberta", "Model", "ForSequenceClassification",
                                                   "ForTokenClassification", "ForQuestionAnswering", "ForMaskedLM",
                                                   "ForMultipleChoice", "ForCausalLM"),
                      BERT_LIKE_SAME, values={"hidden_act": BERT_ACT}, implied={"position_embedding_type": ("absolute",)}),
    "electra": Family("electra", "electra",
                      _heads("Electra", "Model", "ForSequenceClassification", "ForTokenClassification",
                             "ForQuestionAnswering", "ForMultipleChoice")
                      | {"ElectraForPreTraining": "ElectraDiscriminator", "ElectraForMaskedLM": "ElectraGenerator"},
                      BERT_LIKE_SAME | {"embedding_size"}, values={"hidden_act": BERT_ACT},
                      implied={"position_embedding_type": ("absolute",), **ELECTRA_SUMMARY}),
    "deberta-v2": Family("deberta-v2", "deberta-v2",
                         _heads("DebertaV2", "Model", "ForSequenceClassification", "ForTokenClassification",
                                "ForQuestionAnswering", "ForMultipleChoice"),
                         BERT_LIKE_SAME | {"max_relative_positions", "pooler_dropout", "pooler_hidden_act",
                                           "pooler_hidden_size", "pos_att_type", "position_biased_input",
                                           "relative_attention", "position_buckets", "norm_rel_ebd",
                                           "conv_kernel_size", "conv_groups", "embedding_size", "attention_head_size"},
                         implied={"hidden_act": ("gelu",), "conv_act": ("gelu",)},
                         checked=frozenset({"share_att_key"})),
    "gpt2": Family("gpt", "gpt2", {"GPT2Model": "GPTModel", "GPT2LMHeadModel": "GPTForCausalLM"},
                   frozenset({"initializer_range", "vocab_size"}),
                   renames={"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                            "n_positions": "max_position_embeddings", "n_inner": "intermediate_size",
                            "activation_function": "hidden_activation", "resid_pdrop": "hidden_dropout_prob",
                            "attn_pdrop": "attention_probs_dropout_prob"},
                   values={"activation_function": TANH_GELU},
                   implied={"layer_norm_epsilon": (1e-5,), "scale_attn_weights": (True,),
                            "reorder_and_upcast_attn": (False,), "scale_attn_by_inverse_layer_idx": (False,),
                            **GPT2_SUMMARY},
                   ignored=frozenset({"n_ctx"}), checked=frozenset({"embd_pdrop"})),
    "llama": Family("llama", "llama", _heads("Llama", "Model", "ForCausalLM"),
                    frozenset({"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
                               "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps",
                               "rope_theta", "vocab_size"}),
                    implied={"hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,),
                             "rope_scaling": (None,), "attention_dropout": (0.0,)},
                    ignored=frozenset({"pretraining_tp"})),
    "mixtral": Family("mixtral", "mixtral", _heads("Mixtral", "Model", "ForCausalLM"),
                      frozenset({"hidden_act", "hidden_size", "initializer_range", "intermediate_size",
                                 "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
                                 "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size",
                                 "num_experts_per_tok", "num_local_experts", "output_router_logits",
                                 "router_aux_loss_coef", "sliding_window", "attention_dropout"}),
                      implied={"router_jitter_noise": (0.0,)}),
    "t5": Family("t5", "t5", _heads("T5", "Model", "ForConditionalGeneration", "EncoderModel"),
                 frozenset({"d_ff", "d_kv", "d_model", "dropout_rate", "initializer_factor", "layer_norm_epsilon",
                            "num_decoder_layers", "num_heads", "num_layers", "relative_attention_num_buckets",
                            "vocab_size"}),
                 values={"feed_forward_proj": _same_names("relu", "gated-gelu", "gated-silu")},
                 # PaddleNLP 2.8.1's config takes it, but its compute_bias never passes it on: always 128
                 implied={"relative_attention_max_distance": (128,)},
                 ignored=frozenset({"dense_act_fn", "is_gated_act", "n_positions"}),  # HF derives the first two
                 tied_head="lm_head.weight"),
    "opt": Family("opt", "opt", _heads("OPT", "Model", "ForCausalLM"),
                  frozenset({"hidden_size", "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
                             "vocab_size", "word_embed_proj_dim", "enable_bias"}),
                  renames={"ffn_dim": "intermediate_size", "activation_function": "hidden_act",
                           "do_layer_norm_before": "normalize_before", "dropout": "hidden_dropout_prob",
                           "attention_dropout": "attention_probs_dropout_prob", "init_std": "initializer_range"},
                  values={"activation_function": {"relu": "relu", **TANH_GELU}},
                  implied={"layerdrop": (0.0,), "layer_norm_elementwise_affine": (True,),
                           "_remove_final_layer_norm": (False,)}),
    "bloom": Family("bloom", "bloom", _heads("Bloom", "Model", "ForCausalLM", "ForSequenceClassification",
                                             "ForTokenClassification"),
                    frozenset({"apply_residual_connection_post_layernorm", "attention_dropout", "hidden_dropout",
                               "hidden_size", "initializer_range", "layer_norm_epsilon", "n_head", "n_layer",
                               "pretraining_tp", "slow_but_exact", "vocab_size", "attention_softmax_in_fp32",
                               "masked_softmax_fusion"}),
                    renames={"n_embed": "hidden_size"},
                    ignored=frozenset({"bias_dropout_fusion", "offset_alibi", "skip_bias_add", "skip_bias_add_qkv",
                                       "n_inner", "unk_token_id", "seq_length"})),
}


@dataclass
class Translated:
    config: dict
    family: Family
    notes: list[str] = field(default_factory=list)


def family_of(hf: dict, where: str) -> Family:
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise UserError(f"{where}: model_type {model_type!r} is not one this tool translates "
                        f"({', '.join(sorted(FAMILIES))}); convert the weights file alone with --mapping")
    return FAMILIES[model_type]


def _value(family: Family, name: str, value, problems: list[str]):
    table = family.values.get(name)
    if table is None:
        return value
    if isinstance(value, str) and value in table:
        return table[value]
    problems.append(f"'{name}': {value!r} has no PaddleNLP counterpart (it takes {', '.join(map(repr, sorted(set(table))))})")
    return value


def _architectures(family: Family, names, problems: list[str]) -> list[str]:
    out = []
    for name in names or []:
        if name in family.classes:
            out.append(family.classes[name])
        else:
            problems.append(f"'architectures': {name!r} has no PaddleNLP class (it has {', '.join(sorted(family.classes))})")
    return out


def _field(family: Family, name: str, value, out: dict, notes: list[str], problems: list[str]) -> None:
    """Put one HF field into `out` under PaddleNLP's name, or say why it cannot go."""
    implied = {**BASE_IMPLIED, **family.implied}
    if name in family.checked:
        return
    if name in family.renames or name in BASE_RENAMES:
        out[family.renames.get(name) or BASE_RENAMES[name]] = _value(family, name, value, problems)
    elif name in implied:
        if value not in implied[name]:
            problems.append(f"'{name}': {value!r} has no PaddleNLP counterpart (it always behaves as "
                            f"{' or '.join(map(repr, implied[name]))})")
    elif name in family.same or name in family.values or name in BASE_SAME:
        out[name] = _value(family, name, value, problems)
    elif name in BOOKKEEPING or name in family.ignored:
        notes.append(f"left out '{name}' (not read by the model)")
    else:
        problems.append(f"'{name}' has no PaddleNLP counterpart")


def translate_config(hf: dict, force: bool = False, where: str = "config.json") -> Translated:
    """PaddleNLP's config for an HF config dict; a UserError naming every field without a counterpart
    unless `force`, which copies those fields unchanged."""
    family = family_of(hf, where)
    out: dict = {"model_type": family.model_type}
    notes: list[str] = []
    problems: list[str] = []
    for name, value in hf.items():
        if name == "model_type":
            continue
        if name == "architectures":
            out["architectures"] = _architectures(family, value, problems)
            continue
        before = len(problems)
        _field(family, name, value, out, notes, problems)
        if force and len(problems) > before:
            out.setdefault(name, value)
    _family_rules(family, hf, out, problems)
    if problems and not force:
        raise UserError(f"{where}: {len(problems)} field(s) of this {family.model_type} config cannot be said in "
                        "PaddleNLP's config; pass --force to copy them unchanged (PaddleNLP will not act on them)",
                        problems)
    notes += [f"--force: {p}" for p in problems]
    return Translated(out, family, notes)


def _family_rules(family: Family, hf: dict, out: dict, problems: list[str]) -> None:
    """What a field-by-field reading cannot say: defaults that differ, and fields that must agree."""
    if family.model_type == "deberta-v2":
        if hf.get("conv_kernel_size", 0) > 0 and "conv_act" not in hf:
            problems.append("'conv_act' is not given, so HF uses 'tanh' after the conv layer; PaddleNLP always uses "
                            "'gelu'")
        if "share_att_key" in hf:  # PaddleNLP's config takes share_attn_key, its modeling reads share_att_key
            out["share_att_key"] = out["share_attn_key"] = hf["share_att_key"]
        out.setdefault("output_hidden_states", False)  # PaddleNLP's default is True, HF's False
    if family.model_type == "gpt":
        if "n_inner" in hf and hf["n_inner"] is None:
            out["intermediate_size"] = 4 * hf.get("n_embd", 768)
        if hf.get("embd_pdrop", 0.1) != hf.get("resid_pdrop", 0.1):
            problems.append(f"'embd_pdrop': {hf['embd_pdrop']!r} differs from resid_pdrop; PaddleNLP uses "
                            "hidden_dropout_prob for both")
    if family.model_type in ("bert", "roberta", "electra"):
        out.setdefault("type_vocab_size", 2)  # HF's default; PaddleNLP's is 16
