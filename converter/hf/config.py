"""HF `config.json` -> PaddleNLP 2.8.1 `config.json`, field by field.

Each family says, for every field an HF config of that family writes, what PaddleNLP
calls it (`renames`), which values it understands (`values`), which values it always
behaves as without a field to say so (`implied`: written by HF, not by us), and which
fields it takes under the same name (`same`). A field that fits none of these has no
counterpart: that is an error naming it, unless `force`, which copies it unchanged.
The facts come from PaddleNLP 2.8.1's configuration and modeling code.

For PaddleFormers 1.2 (`PADDLEFORMERS_FAMILIES`) the translation is a copy: its configuration
classes read HF transformers 5's config.json under the same names (`dtype`, `rope_parameters`,
`layer_types`, ...). What it checks is the one thing PaddleFormers 1.2 cannot act on: rotary
parameters per layer type with different values (it builds one rotary table for every layer).
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, field
from typing import Callable

from ..errors import UserError, one_line
from ..rules.detect import LIBRARIES, default_target

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
BASE_RENAMES = {"torch_dtype": "dtype", "dtype": "dtype"}  # HF 4.56 and later write "dtype"

BERT_ACT = {a: a for a in ("gelu", "relu", "tanh", "silu", "sigmoid")}  # paddle.nn.functional by name; gelu is erf
TANH_GELU = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}  # families whose "gelu" is the tanh form


@dataclass(frozen=True)
class ConfigFamily:
    """What one HF model type is in the target library: its model_type, rule set and classes, and how
    its config.json fields translate (the layer families of converter.families are another thing)."""

    model_type: str  # PaddleNLP's
    mapping: str  # the shipped rule set
    classes: dict[str, str]  # HF architecture -> PaddleNLP class
    same: frozenset = frozenset()
    renames: dict[str, str] = field(default_factory=dict)
    values: dict[str, dict] = field(default_factory=dict)  # HF field -> {HF value: PaddleNLP value}
    implied: dict[str, tuple] = field(default_factory=dict)  # HF field -> the values PaddleNLP always behaves as
    ignored: frozenset = frozenset()  # fields HF's own modeling does not read either
    tied_head: str | None = None  # a source key to leave out when tie_word_embeddings is true
    ties: bool = True  # HF's default for tie_word_embeddings (a config.json that does not say)
    target_ties: bool | None = None  # the target library's default, where it differs from HF's
    head_copy_of: str | None = None  # a tied head is written as a copy of this key (the target does not tie it)
    checked: frozenset = frozenset()  # fields judged together with others (see _family_rules)
    target: str = "paddlenlp"  # the library: paddlenlp (PaddleNLP 2.8.1) or paddleformers (PaddleFormers 1.2)


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


FAMILIES: dict[str, ConfigFamily] = {
    "bert": ConfigFamily("bert", "bert", _heads("Bert", "Model", "ForSequenceClassification", "ForTokenClassification",
                                          "ForQuestionAnswering", "ForMaskedLM", "ForPreTraining", "ForMultipleChoice"),
                   BERT_LIKE_SAME, values={"hidden_act": BERT_ACT}, implied={"position_embedding_type": ("absolute",)}),
    "roberta": ConfigFamily("roberta", "roberta", _heads("Roberta", "Model", "ForSequenceClassification",
                                                   "ForTokenClassification", "ForQuestionAnswering", "ForMaskedLM",
                                                   "ForMultipleChoice", "ForCausalLM"),
                      BERT_LIKE_SAME, values={"hidden_act": BERT_ACT}, implied={"position_embedding_type": ("absolute",)}),
    "electra": ConfigFamily("electra", "electra",
                      _heads("Electra", "Model", "ForSequenceClassification", "ForTokenClassification",
                             "ForQuestionAnswering", "ForMultipleChoice")
                      | {"ElectraForPreTraining": "ElectraDiscriminator", "ElectraForMaskedLM": "ElectraGenerator"},
                      BERT_LIKE_SAME | {"embedding_size"}, values={"hidden_act": BERT_ACT},
                      implied={"position_embedding_type": ("absolute",), **ELECTRA_SUMMARY}),
    "deberta-v2": ConfigFamily("deberta-v2", "deberta-v2",
                         _heads("DebertaV2", "Model", "ForSequenceClassification", "ForTokenClassification",
                                "ForQuestionAnswering", "ForMultipleChoice"),
                         BERT_LIKE_SAME | {"max_relative_positions", "pooler_dropout", "pooler_hidden_act",
                                           "pooler_hidden_size", "pos_att_type", "position_biased_input",
                                           "relative_attention", "position_buckets", "norm_rel_ebd",
                                           "conv_kernel_size", "conv_groups", "embedding_size", "attention_head_size"},
                         implied={"hidden_act": ("gelu",), "conv_act": ("gelu",)},
                         checked=frozenset({"share_att_key"})),
    "gpt2": ConfigFamily("gpt", "gpt2", {"GPT2Model": "GPTModel", "GPT2LMHeadModel": "GPTForCausalLM"},
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
    "llama": ConfigFamily("llama", "llama", _heads("Llama", "Model", "ForCausalLM"),
                    frozenset({"hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
                               "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps",
                               "rope_theta", "vocab_size"}),
                    implied={"hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,),
                             "rope_scaling": (None,), "attention_dropout": (0.0,)},
                    ignored=frozenset({"pretraining_tp"})),
    "mixtral": ConfigFamily("mixtral", "mixtral", _heads("Mixtral", "Model", "ForCausalLM"),
                      frozenset({"hidden_act", "hidden_size", "initializer_range", "intermediate_size",
                                 "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
                                 "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size",
                                 "num_experts_per_tok", "num_local_experts", "output_router_logits",
                                 "router_aux_loss_coef", "sliding_window", "attention_dropout"}),
                      implied={"router_jitter_noise": (0.0,)}),
    "t5": ConfigFamily("t5", "t5", _heads("T5", "Model", "ForConditionalGeneration", "EncoderModel"),
                 frozenset({"d_ff", "d_kv", "d_model", "dropout_rate", "initializer_factor", "layer_norm_epsilon",
                            "num_decoder_layers", "num_heads", "num_layers", "relative_attention_num_buckets",
                            "vocab_size"}),
                 values={"feed_forward_proj": {n: n for n in ("relu", "gated-gelu", "gated-silu")}},
                 # PaddleNLP 2.8.1's config takes it, but its compute_bias never passes it on: always 128
                 implied={"relative_attention_max_distance": (128,)},
                 ignored=frozenset({"dense_act_fn", "is_gated_act", "n_positions"}),  # HF derives the first two
                 tied_head="lm_head.weight"),
    "opt": ConfigFamily("opt", "opt", _heads("OPT", "Model", "ForCausalLM"),
                  frozenset({"hidden_size", "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
                             "vocab_size", "word_embed_proj_dim", "enable_bias"}),
                  renames={"ffn_dim": "intermediate_size", "activation_function": "hidden_act",
                           "do_layer_norm_before": "normalize_before", "dropout": "hidden_dropout_prob",
                           "attention_dropout": "attention_probs_dropout_prob", "init_std": "initializer_range"},
                  values={"activation_function": {"relu": "relu", **TANH_GELU}},
                  implied={"layerdrop": (0.0,), "layer_norm_elementwise_affine": (True,),
                           "_remove_final_layer_norm": (False,)}),
    "bloom": ConfigFamily("bloom", "bloom", _heads("Bloom", "Model", "ForCausalLM", "ForSequenceClassification",
                                             "ForTokenClassification"),
                    frozenset({"apply_residual_connection_post_layernorm", "attention_dropout", "hidden_dropout",
                               "hidden_size", "initializer_range", "layer_norm_epsilon", "n_head", "n_layer",
                               "pretraining_tp", "slow_but_exact", "vocab_size", "attention_softmax_in_fp32",
                               "masked_softmax_fusion"}),
                    renames={"n_embed": "hidden_size"},
                    ignored=frozenset({"bias_dropout_fusion", "offset_alibi", "skip_bias_add", "skip_bias_add_qkv",
                                       "n_inner", "unk_token_id", "seq_length"})),
}


def _paddleformers(model_type: str, prefix: str, ties: bool = False, target_ties: bool | None = None,
                   ties_itself: bool = True) -> ConfigFamily:
    """A PaddleFormers 1.2 family: HF's class names are PaddleFormers' (the ones that run without
    paddlefleet are listed in docs/model-directories.md). Where its class ties a tied head itself
    (its LMHead holds the embedding's parameter), a tied config's `lm_head.weight` is left out;
    where it does not (`ties_itself` False), the head is written as a copy of the embeddings."""
    return ConfigFamily(model_type, f"paddleformers-{model_type}", _heads(prefix, "Model", "ForCausalLM"),
                  tied_head="lm_head.weight", ties=ties, target_ties=target_ties, target="paddleformers",
                  head_copy_of=None if ties_itself else "model.embed_tokens.weight")


PADDLEFORMERS_FAMILIES: dict[str, ConfigFamily] = {
    "llama": _paddleformers("llama", "Llama", target_ties=True),  # PaddleFormers' LlamaConfig has no default of its own
    "qwen2": _paddleformers("qwen2", "Qwen2"),
    "qwen3": _paddleformers("qwen3", "Qwen3"),
    "phi3": _paddleformers("phi3", "Phi3"),
    "ernie4_5": _paddleformers("ernie4_5", "Ernie4_5", ties=True),
    "qwen2_moe": _paddleformers("qwen2_moe", "Qwen2Moe", ties_itself=False),
    "qwen3_moe": _paddleformers("qwen3_moe", "Qwen3Moe", ties_itself=False),
    "gemma3_text": _paddleformers("gemma3_text", "Gemma3", ties=True),
    "deepseek_v3": _paddleformers("deepseek_v3", "DeepseekV3", ties_itself=False),
    "glm4_moe": _paddleformers("glm4_moe", "Glm4Moe", ties_itself=False),
    "gpt_oss": _paddleformers("gpt_oss", "GptOss", ties_itself=False),
}
TARGET_FAMILIES = {"paddleformers": PADDLEFORMERS_FAMILIES, "paddlenlp": FAMILIES}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63


def _real(v) -> bool:
    return _int(v) or (isinstance(v, float) and math.isfinite(v))


@dataclass(frozen=True)
class Kind:
    """What a field's value must be: `expected` says it in words, `test` checks it."""
    expected: str
    test: Callable[[object], bool]

    def or_null(self) -> Kind:
        return Kind(f"{self.expected} or null", lambda v: v is None or self.test(v))


SIZE = Kind("a positive integer below 2**31", lambda v: _int(v) and 0 < v < 2**31)
COUNT = Kind("an integer from 0 to 2**31 - 1", lambda v: _int(v) and 0 <= v < 2**31)
INT = Kind("a 64-bit integer", _int)
PROB = Kind("a number from 0 to 1", lambda v: _real(v) and 0 <= v <= 1)
POSITIVE = Kind("a finite number above 0", lambda v: _real(v) and v > 0)
NONNEG = Kind("a finite number of 0 or more", lambda v: _real(v) and v >= 0)
REAL = Kind("a finite number", _real)
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
STR = Kind("a string", lambda v: isinstance(v, str))
OBJECT = Kind("a JSON object", lambda v: isinstance(v, dict))
LIST = Kind("a list", lambda v: isinstance(v, list))
TOKEN = Kind("a token id (an integer) or null", lambda v: v is None or _int(v))
TOKENS = Kind("a token id, a list of them, or null", lambda v: TOKEN.test(v) or (isinstance(v, list) and all(map(_int, v))))
STRINGS = Kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
DTYPE = Kind("'float16', 'bfloat16', 'float32', 'float64' or null",  # what paddle can take as PaddleNLP's dtype
             lambda v: v is None or v in ("float16", "bfloat16", "float32", "float64"))

# What each field that some family reads (copies, renames, translates or judges) must hold, as
# HF's configuration classes write it; tests/unit/rules/test_config.py checks that no read field is missing.
KINDS: dict[str, Kind] = {
    **dict.fromkeys(["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                     "max_position_embeddings", "n_embd", "n_embed", "n_head", "n_layer", "n_positions", "d_ff", "d_kv",
                     "d_model", "num_layers", "num_heads", "relative_attention_num_buckets", "ffn_dim",
                     "word_embed_proj_dim", "embedding_size", "num_local_experts", "num_experts_per_tok",
                     "pooler_hidden_size", "attention_head_size", "conv_groups", "pretraining_tp"], SIZE),
    "head_dim": SIZE,
    "rope_parameters": OBJECT.or_null(),
    "layer_types": STRINGS,
    **dict.fromkeys(["attention_bias", "mlp_bias", "use_bias"], BOOL),
    **dict.fromkeys(["n_inner", "num_key_value_heads", "cross_attention_hidden_size"], SIZE.or_null()),
    "sliding_window": COUNT.or_null(),  # HF's Qwen2-MoE writes 0 (no window)
    **dict.fromkeys(["type_vocab_size", "conv_kernel_size", "chunk_size_feed_forward", "max_length", "min_length",
                     "num_beams", "num_beam_groups", "num_return_sequences", "no_repeat_ngram_size",
                     "encoder_no_repeat_ngram_size", "top_k"], COUNT),
    "num_decoder_layers": COUNT.or_null(),
    **dict.fromkeys(["max_relative_positions", "position_buckets"], INT),
    **dict.fromkeys(["hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "attn_pdrop", "embd_pdrop",
                     "dropout", "attention_dropout", "hidden_dropout", "dropout_rate", "pooler_dropout", "top_p",
                     "typical_p"], PROB),
    "classifier_dropout": PROB.or_null(),
    **dict.fromkeys(["layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "rope_theta"], POSITIVE),
    **dict.fromkeys(["initializer_range", "init_std", "initializer_factor", "router_aux_loss_coef", "temperature"],
                    NONNEG),
    **dict.fromkeys(["repetition_penalty", "length_penalty", "diversity_penalty"], REAL),
    **dict.fromkeys(["add_cross_attention", "do_sample", "is_decoder", "is_encoder_decoder", "output_attentions",
                     "output_hidden_states", "output_scores", "remove_invalid_values", "return_dict",
                     "return_dict_in_generate", "tie_encoder_decoder", "tie_word_embeddings", "use_cache",
                     "apply_residual_connection_post_layernorm", "attention_softmax_in_fp32", "masked_softmax_fusion",
                     "slow_but_exact", "output_router_logits", "do_layer_norm_before", "enable_bias", "share_att_key",
                     "relative_attention", "position_biased_input"], BOOL),
    "early_stopping": Kind("true, false or 'never'", lambda v: isinstance(v, bool) or v == "never"),
    **dict.fromkeys(["hidden_act", "activation_function", "feed_forward_proj", "pooler_hidden_act", "norm_rel_ebd"], STR),
    **dict.fromkeys(["torch_dtype", "dtype"], DTYPE),
    **dict.fromkeys(["finetuning_task", "problem_type", "tokenizer_class", "prefix"], STR.or_null()),
    **dict.fromkeys(["bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "forced_bos_token_id"],
                    TOKEN),
    **dict.fromkeys(["eos_token_id", "forced_eos_token_id"], TOKENS),  # generation stops at any of several
    "pos_att_type": Kind("a list of strings, a string or null",
                         lambda v: v is None or isinstance(v, str) or STRINGS.test(v)),
    **dict.fromkeys(["id2label", "label2id", "pruned_heads"], OBJECT),
    "task_specific_params": OBJECT.or_null(),
    **dict.fromkeys(["bad_words_ids", "exponential_decay_length_penalty"], LIST.or_null()),
    "architectures": STRINGS.or_null(),
}

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40
_REPR.maxlist = _REPR.maxdict = 4
_REPR.maxlevel = 3


def shown(value) -> str:
    """A value from config.json for a message: on one line, escaped, at most about 60 characters."""
    text = one_line(_REPR.repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def reads(family: ConfigFamily, name: str) -> bool:
    """Whether the translation reads this field's value for this family (copies, renames,
    translates or judges it)."""
    if family.target == "paddleformers":
        return name not in BOOKKEEPING  # copied as it is
    return (name in family.same or name in family.renames or name in family.values or name in family.checked
            or name in BASE_SAME or name in BASE_RENAMES or name == "architectures")


def check_kinds(hf: dict, family: ConfigFamily, where: str) -> None:
    """Every field the translation reads holds what HF writes there, before anything is
    translated: else a UserError naming each field, its value and what was expected (--force
    does not pass these: a copied '64' where PaddleNLP computes with an integer is wrong output)."""
    problems = [f"field {shown(name)} is {shown(value)} ({_type_name(value)}); expected {KINDS[name].expected}"
                for name, value in hf.items() if reads(family, name) and name in KINDS and not KINDS[name].test(value)]
    if len(problems) == 1:
        raise UserError(f"{where}: {problems[0]}; correct it in config.json (or re-download it)")
    if problems:
        raise UserError(f"{where}: {len(problems)} fields hold values HF's config would not; correct them in "
                        "config.json (or re-download it)", problems)


@dataclass
class Translated:
    config: dict
    family: ConfigFamily
    notes: list[str] = field(default_factory=list)


def family_of(hf: dict, where: str, target: str | None = None) -> ConfigFamily:
    """The family of config.json's model_type for `target`'s library; with no target, the installed
    library's where only one of PaddleFormers and PaddleNLP is installed and has the family, else
    PaddleFormers' where it has the family, else PaddleNLP's."""
    model_type = hf.get("model_type")
    named = isinstance(model_type, str)  # a list or a dict is no key of the tables below
    if target is None:
        target = default_target({lib: named and model_type in families for lib, families in TARGET_FAMILIES.items()})
    families = TARGET_FAMILIES[target]
    if not named or model_type not in families:
        what = "model_type" if named else f"model_type ({_type_name(model_type)})"
        other = [t for t, f in TARGET_FAMILIES.items() if t != target and named and model_type in f]
        instead = f"pass --target {other[0]}" if other else "convert the weights file alone with --mapping"
        raise UserError(f"{where}: {what} {shown(model_type)} is not one this tool translates for "
                        f"{LIBRARIES[target]} ({', '.join(sorted(families))}); {instead}")
    return families[model_type]


def _value(family: ConfigFamily, name: str, value, problems: list[str]):
    table = family.values.get(name)
    if table is None:
        return value
    if isinstance(value, str) and value in table:
        return table[value]
    problems.append(f"'{name}': {shown(value)} has no PaddleNLP counterpart (it takes {', '.join(map(repr, sorted(set(table))))})")
    return value


def _architectures(family: ConfigFamily, names, problems: list[str]) -> list[str]:
    out = []
    for name in names or []:
        if name in family.classes:
            out.append(family.classes[name])
        else:
            problems.append(f"'architectures': {shown(name)} has no PaddleNLP class (it has {', '.join(sorted(family.classes))})")
    return out


def _field(family: ConfigFamily, name: str, value, out: dict, notes: list[str], problems: list[str]) -> None:
    """Put one HF field into `out` under PaddleNLP's name, or say why it cannot go."""
    implied = {**BASE_IMPLIED, **family.implied}
    if name in family.checked:
        return
    if name in family.renames or name in BASE_RENAMES:
        out[family.renames.get(name) or BASE_RENAMES[name]] = _value(family, name, value, problems)
    elif name in implied:
        if value not in implied[name]:
            problems.append(f"'{name}': {shown(value)} has no PaddleNLP counterpart (it always behaves as "
                            f"{' or '.join(map(repr, implied[name]))})")
    elif name in family.same or name in family.values or name in BASE_SAME:
        out[name] = _value(family, name, value, problems)
    elif name in BOOKKEEPING or name in family.ignored:
        notes.append(f"left out '{name}' (not read by the model)")
    else:
        problems.append(f"{shown(name)} has no PaddleNLP counterpart")


def translate_config(hf: dict, force: bool = False, where: str = "config.json", target: str | None = None) -> Translated:
    """PaddleNLP's config for an HF config dict; a UserError naming every field without a counterpart
    unless `force`, which copies those fields unchanged. target: paddleformers or paddlenlp (default:
    PaddleFormers where it has the family), see family_of."""
    family = family_of(hf, where, target)
    check_kinds(hf, family, where)
    if family.target == "paddleformers":
        return _paddleformers_config(hf, family, force, where)
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


def _paddleformers_config(hf: dict, family: ConfigFamily, force: bool, where: str) -> Translated:
    """PaddleFormers 1.2 reads HF 5's config.json under HF's names: every field but HF's bookkeeping
    is copied; rotary parameters that differ per layer type are an error unless `force`."""
    out = {name: value for name, value in hf.items() if name not in BOOKKEEPING}
    notes = [f"left out '{name}' (not read by the model)" for name in hf if name in BOOKKEEPING]
    if "tie_word_embeddings" not in hf and family.target_ties is not None and family.target_ties != family.ties:
        out["tie_word_embeddings"] = family.ties
        notes.append(f"'tie_word_embeddings' is not given: HF {'ties' if family.ties else 'unties'} the LM head by "
                     f"default, PaddleFormers 1.2's {family.model_type} config would {'tie' if family.target_ties else 'untie'}"
                     f" it; wrote tie_word_embeddings: {'true' if family.ties else 'false'}")
    problems = []
    rope = hf.get("rope_parameters")
    per_type = {k: v for k, v in (rope or {}).items() if isinstance(v, dict)}
    thetas = {k: v.get("rope_theta") for k, v in per_type.items()}
    if len(set(map(repr, per_type.values()))) > 1:
        problems.append(f"'rope_parameters' differ per layer type ({shown(thetas)}); PaddleFormers 1.2 builds one "
                        "rotary table and applies it to every layer")
    elif per_type and _real(theta := next(iter(thetas.values()))):
        # PaddleFormers 1.2 takes the base of per-layer-type rope_parameters from rope_theta (Gemma 3: default 1e6)
        if "rope_theta" not in hf:
            out["rope_theta"] = theta
            notes.append(f"wrote rope_theta: {shown(theta)}, the rotary base of every layer type in "
                         "'rope_parameters': PaddleFormers 1.2 reads the base from rope_theta, not from "
                         "per-layer-type rope_parameters")
        elif hf["rope_theta"] != theta:
            problems.append(f"'rope_theta' {shown(hf['rope_theta'])} differs from the rotary base of every layer type "
                            f"in 'rope_parameters' ({shown(theta)}): HF uses the latter, PaddleFormers 1.2 the former")
    if problems and not force:
        raise UserError(f"{where}: {len(problems)} field(s) of this {family.model_type} config cannot be said in "
                        "PaddleFormers 1.2's config; pass --force to copy them unchanged (PaddleFormers will not act "
                        "on them)", problems)
    return Translated(out, family, notes + [f"--force: {p}" for p in problems])


def _family_rules(family: ConfigFamily, hf: dict, out: dict, problems: list[str]) -> None:
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
        embd, resid = hf.get("embd_pdrop", 0.1), hf.get("resid_pdrop", 0.1)  # HF's defaults
        if embd != resid:
            problems.append(f"'embd_pdrop' {shown(embd)} differs from 'resid_pdrop' {shown(resid)} (HF's default is 0.1 "
                            "where one is not given); PaddleNLP uses hidden_dropout_prob for both")
    if family.model_type in ("bert", "roberta", "electra"):
        out.setdefault("type_vocab_size", 2)  # HF's default; PaddleNLP's is 16
