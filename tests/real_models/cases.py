"""The real-model cases: HF transformers models (torch) against PaddleNLP 2.8.1's ports, clean
and with one planted porting bug each.

A bug is planted in the paddle model the spec builds: a layer's forward replaced on that one
instance (types.MethodType), an attribute or config value changed, or a weight changed after
the port's weights are loaded. PaddleNLP's installed files are never touched, and nothing is
patched at module level, so cases can run one after another in one process.

Every case is also a spec file, `specs/<name>.py`, for `verify-port --spec ... --bisect`;
`python tests/real_models/cases.py` writes them from this catalogue.

This module imports neither transformers nor PaddleNLP at import time.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC_DIR = os.path.join(HERE, "specs")
sys.path.insert(0, HERE)

import families as F  # noqa: E402


@dataclass(frozen=True)
class Family:
    name: str
    torch_model: Callable
    paddle_model: Callable
    inputs: Callable  # explicit_positions -> dict of numpy arrays
    mapping: str | None
    takes_positions: bool


FAMILIES = {
    "bert": Family("bert", F.bert_torch, F.bert_paddle, F.bert_inputs, "bert", True),
    "gpt2": Family("gpt2", F.gpt2_torch, F.gpt2_paddle, F.gpt2_inputs, "gpt2", True),
    "llama": Family("llama", F.llama_torch, F.llama_paddle, F.llama_inputs, "llama", True),
    # same key names on both sides: the rules are inferred from the two models
    "deberta": Family("deberta", F.deberta_torch, F.deberta_paddle, F.deberta_inputs, None, False),
    # the width of the TF32 report's model, DeBERTa-v2-xlarge: one layer of its real shape
    "deberta-xl": Family("deberta-xl", F.deberta_xl_torch, F.deberta_xl_paddle, F.deberta_xl_inputs, None, False),
    # encoder-decoder with relative attention bias: v1.0 (ReLU, head tied to the embeddings) and v1.1 (gated GELU, untied)
    "t5": Family("t5", F.t5_torch, F.t5_paddle, F.t5_inputs, "t5", False),
    "t5-untied": Family("t5-untied", F.t5_untied_torch, F.t5_untied_paddle, F.t5_inputs, "t5", False),
    # HF runs the feed-forward on [B*T, H], PaddleNLP on [B, T, H]; HF's mask needs float64 as torch's default dtype
    "opt": Family("opt", F.opt_torch, F.opt_paddle, F.opt_inputs, "opt", False),
    # HF's default DeBERTa-v2: separate position projections, absolute positions, token types, embed_proj
    "deberta-separate": Family("deberta-separate", F.deberta_separate_torch, F.deberta_separate_paddle,
                               F.deberta_separate_inputs, None, True),
    # grouped-query attention: HF Mistral (4 heads, 2 key/value heads) onto PaddleNLP's Llama
    "mistral": Family("mistral", F.mistral_torch, F.mistral_paddle, F.llama_inputs, "llama", True),
    # ERNIE 3.0's keys are BERT's
    "ernie": Family("ernie", F.ernie_torch, F.ernie_paddle, F.ernie_inputs, "bert", True),
    # a post-norm encoder-decoder on paddle.nn.TransformerEncoder/Decoder
    "bart": Family("bart", F.bart_torch, F.bart_paddle, F.bart_inputs, os.path.join(HERE, "bart.json"), False),
    # the LM head and its persistable buffer final_logits_bias
    "bart-lm": Family("bart-lm", F.bart_lm_torch, F.bart_lm_paddle, F.bart_inputs, os.path.join(HERE, "bart.json"),
                      False),
    # a pre-norm encoder-decoder, a final layer norm on each side
    "mbart": Family("mbart", F.mbart_torch, F.mbart_paddle, F.bart_inputs, os.path.join(HERE, "bart.json"), False),
    # a sparse mixture of experts; the port's MoE forward needs one reshape to run under paddle 3.x (families.py)
    "mixtral": Family("mixtral", F.mixtral_torch, F.mixtral_paddle, F.llama_inputs, "mixtral", True),
    # a ViT: patch convolution, class token, pre-norm layers with quick GELU
    "clip-vision": Family("clip-vision", F.clip_vision_torch, F.clip_vision_paddle, F.clip_vision_inputs,
                          os.path.join(HERE, "clip.json"), False),
    "clip-text": Family("clip-text", F.clip_text_torch, F.clip_text_paddle, F.clip_text_inputs,
                        os.path.join(HERE, "clip.json"), True),
    # a fused query_key_value, ALiBi position biases
    "bloom": Family("bloom", F.bloom_torch, F.bloom_paddle, F.bloom_inputs, "bloom", False),
    # positions derived from the tokens, offset by the pad id
    "roberta": Family("roberta", F.roberta_torch, F.roberta_paddle, F.roberta_inputs, "roberta", False),
    # embeddings narrower than the encoder, projected up
    "electra": Family("electra", F.electra_torch, F.electra_paddle, F.electra_inputs, "electra", True),
}


@dataclass(frozen=True)
class Defect:
    """A defect of the verifier, seen on a case: the answer it gives there is wrong, and how."""
    what: str
    strategies: tuple = ("auto", "full", "binary")  # the strategies whose answer it spoils


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    what: str  # the bug, in words ("" for a clean pair)
    culprit: str | None = None  # torch module that must be named, as named_modules() spells it
    diagnosis: str | None = None  # a word the diagnosis must contain
    plant: Callable | None = None  # paddle model -> None, before the weights are loaded
    after_load: Callable | None = None  # paddle model -> None, after the weights are loaded
    explicit_positions: bool = True
    paddle_config: dict | None = None  # config values that differ from the clean port
    config: dict | None = None  # config values both sides are built from that differ from the family's
    mapping: str | None = None  # a rule file that replaces the family's mapping
    defects: tuple = ()  # Defects of the verifier that spoil its answer: an expected failure where they do
    emulate: tuple = ()  # verify-port --emulate values (paddle=tf32: paddle's products in TF32, as on an RTX 3090)
    strategies: tuple = ("auto", "full", "binary")  # the strategies it runs under

    @property
    def clean(self) -> bool:
        return self.culprit is None

    def defect(self, strategy: str) -> Defect | None:
        """The verifier defect that spoils this strategy's answer, if one does."""
        return next((d for d in self.defects if strategy in d.strategies), None)

    @property
    def spec_path(self) -> str:
        return os.path.join(SPEC_DIR, self.name + ".py")


# ---- building a case's models

def torch_model(case: Case):
    return FAMILIES[case.family].torch_model(**(case.config or {}))


def paddle_model(case: Case):
    family = FAMILIES[case.family]
    model = family.paddle_model(**dict(case.config or {}, **(case.paddle_config or {})))
    if case.plant:
        case.plant(model)
    if case.after_load:
        _after_loading(model, case.after_load)
    return model


def inputs(case: Case) -> dict:
    return FAMILIES[case.family].inputs(case.explicit_positions)


def mapping(case: Case):
    return case.mapping or FAMILIES[case.family].mapping


def _after_loading(model, change):
    """Apply `change` each time weights are loaded into the model: the port's loading code is
    where such a bug lives (a weight left untransposed, a head that is no longer tied)."""
    load = model.set_state_dict

    def set_state_dict(self, *args, **kwargs):
        result = load(*args, **kwargs)
        change(self)
        return result
    model.set_state_dict = types.MethodType(set_state_dict, model)


def _forward(layer, fn):
    layer.forward = types.MethodType(fn, layer)


def _paddle():
    import paddle
    return paddle


# ---- the planted bugs

def _positions_from_one(layer):
    """BERT embeddings whose default position ids start at 1 (cumsum without subtracting one)."""
    def forward(self, input_ids, token_type_ids=None, position_ids=None, past_key_values_length=None):
        paddle = _paddle()
        if position_ids is None:
            position_ids = paddle.cumsum(paddle.ones_like(input_ids, dtype="int64"), axis=-1)
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids, dtype="int64")
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids) \
            + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(x))
    _forward(layer, forward)


def _set_epsilon(layer, attribute, value):
    setattr(layer, attribute, value)


def _untranspose(path):
    """Replace the loaded weight at `path` by its transpose: torch's [out, in] matrix as it was."""
    def change(model):
        weight = dict(model.named_parameters())[path]
        weight.set_value(weight.numpy().T.copy())
    return change


def _untie_head(model):
    """The head gets a parameter of its own, no longer the word embeddings."""
    paddle = _paddle()
    paddle.seed(1)
    shape = model.lm_head.weight.shape
    model.lm_head.weight = model.lm_head.create_parameter(
        shape, default_initializer=paddle.nn.initializer.Normal(0.0, 1.0))


def _gpt_core_attention(causal=True, scale=None, axis=-1):
    """PaddleNLP GPT's core attention written out again with one choice made differently."""
    def core(self, q, k, v, attention_mask=None, output_attentions=False):
        paddle = _paddle()
        q, k, v = (t.transpose([0, 2, 1, 3]) for t in (q, k, v))
        d = q.shape[-1]
        scores = paddle.matmul(q, k, transpose_y=True) * (d ** -0.5 if scale is None else scale(d))
        if causal:
            t = scores.shape[-1]
            upper = paddle.triu(paddle.ones([t, t], dtype="bool"), diagonal=1)
            scores = paddle.where(upper, paddle.full_like(scores, -1e4), scores)
        weights = paddle.nn.functional.softmax(scores, axis=axis)
        out = paddle.matmul(weights, v).transpose([0, 2, 1, 3])
        out = out.reshape([0, 0, -1])
        return (out, weights) if output_attentions else out
    return core


def _gpt_block_without_mlp_residual(self, hidden_states, attention_mask=None, use_cache=False,
                                    past_key_value=None, output_attentions=False):
    paddle = _paddle()
    h = hidden_states + self.self_attn(self.norm1(hidden_states), None, None, attention_mask)
    gelu = paddle.nn.functional.gelu
    return self.linear2(gelu(self.linear1(self.norm2(h)), approximate=True))  # + h forgotten


def _llama_mlp_functional_dropout(self, x):
    F_ = _paddle().nn.functional
    return self.down_proj(F_.dropout(F_.silu(self.gate_proj(x)) * self.up_proj(x), 0.1))  # training=True by default


def _attention_without_causal_mask(layer, argument="attention_mask"):
    """The attention is called with a mask that hides nothing: the causal part was forgotten."""
    paddle = _paddle()
    original = layer.forward
    signature = inspect.signature(original)

    def forward(self, *args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        mask = bound.arguments.get(argument)
        if mask is not None:
            bound.arguments[argument] = paddle.ones_like(mask) if mask.dtype == paddle.bool \
                else paddle.zeros_like(mask)
        return original(*bound.args, **bound.kwargs)
    layer.forward = types.MethodType(forward, layer)


def _deberta_output_without_residual(self, hidden_states, input_tensor):
    return self.LayerNorm(self.dropout(self.dense(hidden_states)))  # + input_tensor forgotten


def _exact_gelu(model):
    model.encoder.layer[0].intermediate.intermediate_act_fn = _paddle().nn.GELU(approximate=True)


def _t5_attention_scaled(self, hidden_states, mask=None, key_value_states=None, position_bias=None, cache=None,
                         query_length=None, use_cache=False, output_attentions=False):
    """PaddleNLP T5's attention (without a cache) written out again with its logits scaled by
    1/sqrt(d_kv), as other transformers do: T5 folds that scale into its initialisation."""
    paddle = _paddle()
    batch = hidden_states.shape[0]

    def heads(x):
        return x.reshape([batch, -1, self.n_heads, self.key_value_proj_dim]).transpose([0, 2, 1, 3])
    source = hidden_states if key_value_states is None else key_value_states
    q, k, v = heads(self.q(hidden_states)), heads(self.k(source)), heads(self.v(source))
    scores = paddle.matmul(q, k, transpose_y=True) * self.key_value_proj_dim ** -0.5
    if position_bias is None:
        if self.has_relative_attention_bias:
            position_bias = self.compute_bias(q.shape[2], k.shape[2])
        else:
            position_bias = paddle.zeros([1, self.n_heads, q.shape[2], k.shape[2]], dtype=scores.dtype)
        if mask is not None:
            position_bias = position_bias + mask
    weights = paddle.nn.functional.softmax(scores + position_bias, axis=-1)
    out = self.o(paddle.matmul(weights, v).transpose([0, 2, 1, 3]).reshape([batch, -1, self.inner_dim]))
    return (out, None, position_bias) + ((weights,) if output_attentions else ())


def _t5_bias(bidirectional: bool | None = None, buckets: Callable = lambda n: n):
    """T5's relative position bias with the direction (decoder: causal buckets, encoder: both
    ways) or the bucket count chosen differently; the embedding itself is untouched."""
    def compute_bias(self, query_length, key_length):
        paddle = _paddle()
        relative = paddle.arange(key_length, dtype="int64").unsqueeze(0) \
            - paddle.arange(query_length, dtype="int64").unsqueeze(-1)
        both_ways = not self.is_decoder if bidirectional is None else bidirectional
        bucket = self._relative_position_bucket(relative, bidirectional=both_ways,
                                                num_buckets=buckets(self.relative_attention_num_buckets))
        return self.relative_attention_bias(bucket).transpose([2, 0, 1]).unsqueeze(0)
    return compute_bias


def _t5_method(layer, name, fn):
    setattr(layer, name, types.MethodType(fn, layer))


def _t5_ff_without_residual(self, hidden_states):
    return self.dropout(self.DenseReluDense(self.layer_norm(hidden_states)))  # + hidden_states forgotten


def _t5_cross_attention_without_residual(self, hidden_states, key_value_states, attention_mask=None,
                                         position_bias=None, cache=None, use_cache=False, query_length=None,
                                         output_attentions=False):
    out = self.EncDecAttention(self.layer_norm(hidden_states), mask=attention_mask, key_value_states=key_value_states,
                               position_bias=position_bias, cache=cache, use_cache=use_cache,
                               query_length=query_length, output_attentions=output_attentions)
    return (self.dropout(out[0]),) + out[1:]  # hidden_states + ... forgotten


def _opt_layer_without_ffn_residual(self, tgt, memory, tgt_mask=None, use_cache=False, cache=None,
                                    output_attentions=False):
    """PaddleNLP OPT's decoder layer (pre-norm, without a cache) with the feed-forward's residual forgotten."""
    h = tgt + self.dropout1(self.self_attn(self.norm1(tgt), None, None, tgt_mask)[0])
    return self.dropout2(self.linear2(self.activation(self.linear1(self.norm2(h)))))  # + h forgotten


def _opt_attention_unscaled(self, query, key, value, attn_mask=None, use_cache=False, cache=None):
    """PaddleNLP OPT's attention (without a cache) with the logits left unscaled."""
    paddle = _paddle()
    q, k, v, _ = self._prepare_qkv(query, query, query, False, None)
    product = paddle.matmul(q, k, transpose_y=True)  # * head_dim ** -0.5 forgotten
    if attn_mask is not None:
        product = product + attn_mask
    weights = paddle.nn.functional.softmax(product)
    out = paddle.matmul(weights, v).transpose([0, 2, 1, 3])
    return self.out_proj(out.reshape([0, 0, -1])), weights


def _opt_gelu(model):
    model.decoder.layers[0].activation = _paddle().nn.GELU()  # torch: ReLU


def _t5_exact_gelu(model):
    model.t5.decoder.block[0].layer[2].DenseReluDense.gelu_act = _paddle().nn.GELU()  # torch: gelu_new (tanh)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _encoder_layer_without_ffn_residual(self, src, src_mask=None, cache=None, output_attentions=False):
    """paddle.nn.TransformerEncoderLayer (as PaddleNLP runs it, without a cache), pre- or post-norm,
    with the feed-forward's residual forgotten."""
    from paddle.nn.layer.transformer import _convert_attention_mask
    src_mask = _convert_attention_mask(src_mask, src.dtype)
    h = self.norm1(src) if self.normalize_before else src
    src = src + self.dropout1(_first(self.self_attn(h, h, h, src_mask)))
    if not self.normalize_before:
        src = self.norm1(src)
    h = self.norm2(src) if self.normalize_before else src
    out = self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(h)))))  # src + ... forgotten
    return out if self.normalize_before else self.norm2(out)


def _decoder_layer_without_cross_residual(self, tgt, memory, tgt_mask=None, memory_mask=None, cache=None,
                                          output_attentions=False):
    """paddle.nn.TransformerDecoderLayer, post-norm as BART's (without a cache), with the
    cross-attention's residual forgotten."""
    from paddle.nn.layer.transformer import _convert_attention_mask
    tgt_mask = _convert_attention_mask(tgt_mask, tgt.dtype)
    memory_mask = _convert_attention_mask(memory_mask, memory.dtype)
    h = self.norm1(tgt + self.dropout1(_first(self.self_attn(tgt, tgt, tgt, tgt_mask, None))))
    h = self.norm2(self.dropout2(_first(self.cross_attn(h, memory, memory, memory_mask, None))))  # h + forgotten
    return self.norm3(h + self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(h))))))


def _set_activation(layer, activation):
    """The layer's activation function replaced by a paddle layer computing another variant."""
    layer.activation = activation


def _logits_bias_not_persistable(model):
    model.register_buffer("final_logits_bias", model.final_logits_bias, persistable=False)


def _llama_mlp_gelu(self, x):
    F_ = _paddle().nn.functional
    return self.down_proj(F_.gelu(self.gate_proj(x)) * self.up_proj(x))  # torch: SiLU


def _exchange_kv_heads(path, kv_heads):
    """The loaded [in, kv_heads * head_dim] weight at `path` with its key/value heads in reverse
    order: a rule that regroups grouped-query heads wrongly."""
    def change(model):
        weight = dict(model.named_parameters())[path]
        w = weight.numpy()
        heads = w.reshape(w.shape[0], kv_heads, -1)[:, ::-1]
        weight.set_value(heads.reshape(w.shape).copy())
    return change


def _bloom_split_by_kind(self, fused_qkv):
    """BLOOM's fused query_key_value output split as [q | k | v] (each [heads, head_dim]), where
    its columns are per head, [heads, (q, k, v), head_dim]: the GPT-2 layout read into BLOOM's."""
    batch, seq, _ = fused_qkv.shape
    qkv = fused_qkv.reshape([batch, seq, 3, self.num_heads, self.head_dim])
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

QK_SWAPPED = os.path.join(HERE, "llama_qk_swapped.json")

TF32 = ("paddle=tf32",)
XL_STRATEGIES = ("auto", "binary")
OPT_350M = {"do_layer_norm_before": False, "word_embed_proj_dim": 16}  # post-LN, project_in and project_out

CLEAN = [
    Case("bert-clean", "bert", ""),
    Case("bert-clean-default-positions", "bert", "", explicit_positions=False),
    Case("gpt2-clean", "gpt2", ""),
    Case("gpt2-clean-default-positions", "gpt2", "", explicit_positions=False),
    Case("llama-clean", "llama", ""),
    Case("llama-clean-default-positions", "llama", "", explicit_positions=False),
    Case("deberta-clean", "deberta", ""),
    Case("deberta-xl-clean", "deberta-xl", "", strategies=XL_STRATEGIES),
    Case("deberta-xl-clean-tf32", "deberta-xl", "", emulate=TF32, strategies=XL_STRATEGIES),
    Case("t5-clean", "t5", ""),
    Case("t5-untied-clean", "t5-untied", ""),
    Case("opt-clean", "opt", ""),
    Case("opt-350m-clean", "opt", "", config=OPT_350M),
    Case("deberta-separate-clean", "deberta-separate", ""),
    Case("deberta-separate-clean-default-positions", "deberta-separate", "", explicit_positions=False),
    Case("mistral-clean", "mistral", ""),
    Case("mistral-clean-default-positions", "mistral", "", explicit_positions=False),
    Case("ernie-clean", "ernie", ""),
    Case("ernie-clean-default-positions", "ernie", "", explicit_positions=False),
    Case("bart-clean", "bart", ""),
    Case("bart-lm-clean", "bart-lm", ""),
    Case("mbart-clean", "mbart", ""),
    Case("mixtral-clean", "mixtral", ""),
    Case("mixtral-clean-default-positions", "mixtral", "", explicit_positions=False),
    Case("clip-vision-clean", "clip-vision", ""),
    Case("clip-text-clean", "clip-text", ""),
    Case("clip-text-clean-default-positions", "clip-text", "", explicit_positions=False),
    Case("bloom-clean", "bloom", ""),
    Case("roberta-clean", "roberta", ""),
    Case("electra-clean", "electra", ""),
    Case("electra-clean-default-positions", "electra", "", explicit_positions=False),
]

BUGS = [
    Case("bert-position-ids-from-one", "bert", "default position ids start at 1", "embeddings", "own forward",
         plant=lambda m: _positions_from_one(m.embeddings), explicit_positions=False),
    Case("bert-layernorm-epsilon", "bert", "a LayerNorm built with epsilon 1e-5 (torch: 1e-12)",
         "encoder.layer.1.output.LayerNorm", "epsilon",
         plant=lambda m: _set_epsilon(m.encoder.layers[1].norm2, "_epsilon", 1e-5)),
    Case("bert-query-untransposed", "bert", "square query weight loaded without its transpose",
         "encoder.layer.0.attention.self.query", "untransposed",
         after_load=_untranspose("encoder.layers.0.self_attn.q_proj.weight")),
    Case("gpt2-no-causal-mask", "gpt2", "attention ignores the causal mask", "transformer.h.0.attn", "causal",
         plant=lambda m: _forward_core(m, 0, _gpt_core_attention(causal=False))),
    Case("gpt2-attention-scale-1-over-d", "gpt2", "attention logits scaled by 1/d instead of 1/sqrt(d)",
         "transformer.h.1.attn", "scale", plant=lambda m: _forward_core(m, 1, _gpt_core_attention(scale=lambda d: 1 / d))),
    Case("gpt2-attention-unscaled", "gpt2", "attention logits not scaled at all", "transformer.h.0.attn", "scale",
         plant=lambda m: _forward_core(m, 0, _gpt_core_attention(scale=lambda d: 1.0))),
    Case("gpt2-softmax-axis", "gpt2", "softmax over the query axis", "transformer.h.1.attn",
         "softmax(..., axis=-2); re-run on torch's recorded inputs with axis=-1",
         plant=lambda m: _forward_core(m, 1, _gpt_core_attention(axis=-2))),
    Case("gpt2-dropped-residual", "gpt2", "the MLP's residual is dropped", "transformer.h.1", "own forward",
         plant=lambda m: _forward(m.gpt.decoder.layers[1], _gpt_block_without_mlp_residual)),
    Case("gpt2-layernorm-epsilon", "gpt2", "a LayerNorm built with epsilon 1e-3 (torch: 1e-5)",
         "transformer.h.0.ln_2", "epsilon",
         plant=lambda m: _set_epsilon(m.gpt.decoder.layers[0].norm2, "_epsilon", 1e-3)),
    Case("gpt2-untied-head", "gpt2", "the output head is its own parameter, no longer the word embeddings",
         "lm_head", "tie", after_load=_untie_head),
    Case("llama-rmsnorm-epsilon", "llama", "an RMSNorm with variance_epsilon 1e-5 (torch: 1e-6)",
         "model.layers.1.post_attention_layernorm", "epsilon",
         plant=lambda m: _set_epsilon(m.llama.layers[1].post_attention_layernorm, "variance_epsilon", 1e-5)),
    Case("llama-rope-theta", "llama", "rotary base 500000 (torch: 10000)", "model.layers.0.self_attn", "own forward",
         paddle_config={"rope_theta": 500000.0}),
    Case("llama-qk-swapped", "llama", "the rule file exchanges layer 0's q_proj and k_proj",
         "model.layers.0.self_attn", "exchanged", mapping=QK_SWAPPED),
    Case("llama-o-proj-untransposed", "llama", "square o_proj weight loaded without its transpose",
         "model.layers.1.self_attn.o_proj", "untransposed",
         after_load=_untranspose("llama.layers.1.self_attn.o_proj.weight")),
    Case("llama-mlp-dropout", "llama", "F.dropout in the MLP without training=self.training", "model.layers.0.mlp",
         "dropout", plant=lambda m: _forward(m.llama.layers[0].mlp, _llama_mlp_functional_dropout)),
    Case("llama-no-causal-mask", "llama", "attention gets a mask that hides nothing", "model.layers.1.self_attn",
         "causal", plant=lambda m: _attention_without_causal_mask(m.llama.layers[1].self_attn)),
    Case("deberta-gelu-tanh", "deberta", "GELU's tanh form where torch uses the exact one",
         "encoder.layer.0.intermediate.intermediate_act_fn", "GELU", plant=_exact_gelu),
    Case("deberta-dropped-residual", "deberta", "the attention output's residual is dropped",
         "encoder.layer.1.attention.output", "own forward",
         plant=lambda m: _forward(m.encoder.layer[1].attention.output, _deberta_output_without_residual)),
    # the TF32 report's situation: paddle's products in TF32 on a DeBERTa-v2-xlarge layer, and one real bug
    Case("deberta-xl-tf32-layernorm-epsilon", "deberta-xl", "a LayerNorm with epsilon 1e-5 "
         "(torch: 1e-7)", "encoder.layer.0.attention.output.LayerNorm", "epsilon", emulate=TF32,
         strategies=XL_STRATEGIES,
         plant=lambda m: _set_epsilon(m.encoder.layer[0].attention.output.LayerNorm, "_epsilon", 1e-5)),
    Case("deberta-xl-tf32-gelu-tanh", "deberta-xl", "GELU's tanh form where torch uses the exact one",
         "encoder.layer.0.intermediate.intermediate_act_fn", "GELU", plant=_exact_gelu, emulate=TF32,
         strategies=XL_STRATEGIES),
    Case("deberta-xl-tf32-dropped-residual", "deberta-xl", "the attention output's residual is dropped",
         "encoder.layer.0.attention.output", "own forward", emulate=TF32, strategies=XL_STRATEGIES,
         plant=lambda m: _forward(m.encoder.layer[0].attention.output, _deberta_output_without_residual)),
    Case("t5-attention-scaled", "t5", "attention logits scaled by 1/sqrt(d_kv) (T5 does not scale them)",
         "encoder.block.1.layer.0.SelfAttention", "scale",
         plant=lambda m: _forward(m.t5.encoder.block[1].layer[0].SelfAttention, _t5_attention_scaled)),
    Case("t5-layernorm-epsilon", "t5", "a T5LayerNorm with variance_epsilon 1e-5 (torch: 1e-6)",
         "encoder.block.0.layer.1.layer_norm", "epsilon",
         plant=lambda m: _set_epsilon(m.t5.encoder.block[0].layer[1].layer_norm, "variance_epsilon", 1e-5)),
    Case("t5-decoder-bias-bidirectional", "t5", "the decoder's position buckets both ways",
         "decoder.block.0.layer.0.SelfAttention", "own forward",
         plant=lambda m: _t5_method(m.t5.decoder.block[0].layer[0].SelfAttention, "compute_bias",
                                    _t5_bias(bidirectional=True))),
    Case("t5-bias-buckets-halved", "t5", "the encoder's relative positions put in half the buckets",
         "encoder.block.0.layer.0.SelfAttention",
         "computes with relative_attention_num_buckets=4 (torch's has relative_attention_num_buckets=8)",
         plant=lambda m: _t5_method(m.t5.encoder.block[0].layer[0].SelfAttention, "compute_bias",
                                    _t5_bias(buckets=lambda n: n // 2))),
    Case("t5-dropped-residual", "t5", "the decoder's feed-forward residual is dropped", "decoder.block.1.layer.2",
         "own forward", plant=lambda m: _forward(m.t5.decoder.block[1].layer[2], _t5_ff_without_residual)),
    Case("t5-max-distance", "t5", "not planted: PaddleNLP ignores relative_attention_max_distance",
         "encoder.block.0.layer.0.SelfAttention", "own forward",
         config={"relative_attention_max_distance": 16}),
    Case("t5-no-causal-mask", "t5", "the decoder's first self-attention gets a mask that hides nothing",
         "decoder.block.0.layer.0.SelfAttention", "causal",
         plant=lambda m: _attention_without_causal_mask(m.t5.decoder.block[0].layer[0].SelfAttention, "mask")),
    Case("t5-untied-gelu-exact", "t5-untied", "the gated FFN's GELU in its exact form (torch: gelu_new, tanh)",
         "decoder.block.0.layer.2.DenseReluDense.act", "GELU", plant=_t5_exact_gelu),
    Case("t5-untied-dropped-residual", "t5-untied", "the cross-attention's residual is dropped",
         "decoder.block.1.layer.1", "own forward",
         plant=lambda m: _forward(m.t5.decoder.block[1].layer[1], _t5_cross_attention_without_residual)),
    Case("t5-untied-dropped-residual-block-0", "t5-untied", "the first cross-attention's residual is dropped",
         "decoder.block.0.layer.1", "own forward",
         plant=lambda m: _forward(m.t5.decoder.block[0].layer[1], _t5_cross_attention_without_residual)),
    Case("opt-layernorm-epsilon", "opt", "the FFN's LayerNorm built with epsilon 1e-3 (torch: 1e-5)",
         "decoder.layers.1.final_layer_norm", "epsilon",
         plant=lambda m: _set_epsilon(m.decoder.layers[1].norm2, "_epsilon", 1e-3)),
    Case("opt-activation-gelu", "opt", "the FFN's activation is GELU (OPT uses ReLU)", "decoder.layers.0.activation_fn",
         "activation variant", plant=_opt_gelu),
    Case("opt-dropped-residual", "opt", "the feed-forward's residual is dropped", "decoder.layers.1", "own forward",
         plant=lambda m: _forward(m.decoder.layers[1], _opt_layer_without_ffn_residual)),
    Case("opt-attention-unscaled", "opt", "attention logits not scaled at all", "decoder.layers.0.self_attn", "scale",
         plant=lambda m: _forward(m.decoder.layers[0].self_attn, _opt_attention_unscaled)),
    Case("opt-no-causal-mask", "opt", "attention gets a mask that hides nothing", "decoder.layers.1.self_attn",
         "causal", plant=lambda m: _attention_without_causal_mask(m.decoder.layers[1].self_attn, "attn_mask")),
    Case("opt-350m-layernorm-epsilon", "opt", "a post-LN LayerNorm built with epsilon 1e-3 (torch: 1e-5)",
         "decoder.layers.1.self_attn_layer_norm", "epsilon", config=OPT_350M,
         plant=lambda m: _set_epsilon(m.decoder.layers[1].norm1, "_epsilon", 1e-3)),
    Case("opt-350m-activation-gelu", "opt", "the FFN's activation is GELU (OPT uses ReLU)",
         "decoder.layers.0.activation_fn", "activation variant", config=OPT_350M, plant=_opt_gelu),
    Case("deberta-separate-pos-query-untransposed", "deberta-separate", "square pos_query_proj weight untransposed",
         "encoder.layer.1.attention.self.pos_query_proj", "untransposed",
         after_load=_untranspose("encoder.layer.1.attention.self.pos_query_proj.weight")),
    Case("deberta-separate-gelu-tanh", "deberta-separate", "GELU's tanh form where torch uses the exact one",
         "encoder.layer.0.intermediate.intermediate_act_fn", "GELU", plant=_exact_gelu),
    Case("mistral-rmsnorm-epsilon", "mistral", "an RMSNorm with variance_epsilon 1e-5 (torch: 1e-6)",
         "model.layers.0.input_layernorm", "epsilon",
         plant=lambda m: _set_epsilon(m.llama.layers[0].input_layernorm, "variance_epsilon", 1e-5)),
    Case("mistral-kv-heads-exchanged", "mistral", "layer 1's two value heads loaded in reverse order",
         "model.layers.1.self_attn.v_proj", "differs",
         after_load=_exchange_kv_heads("llama.layers.1.self_attn.v_proj.weight", 2)),
    # the GELU called directly is tried replaced by the other activations in its place: SiLU reproduces torch
    Case("mistral-mlp-gelu", "mistral", "the gated MLP's activation is GELU (torch: SiLU)", "model.layers.1.mlp",
         "calls paddle.nn.functional.gelu; re-run on torch's recorded inputs with paddle.nn.functional.silu in its "
         "place", plant=lambda m: _forward(m.llama.layers[1].mlp, _llama_mlp_gelu)),
    Case("ernie-layernorm-epsilon", "ernie", "a LayerNorm built with epsilon 1e-5 (torch: 1e-12)",
         "encoder.layer.0.output.LayerNorm", "epsilon",
         plant=lambda m: _set_epsilon(m.encoder.layers[0].norm2, "_epsilon", 1e-5)),
    Case("ernie-gelu-tanh", "ernie", "GELU's tanh form where torch uses the exact one",
         "encoder.layer.1.intermediate.intermediate_act_fn", "GELU",
         plant=lambda m: _set_activation(m.encoder.layers[1], _paddle().nn.GELU(approximate=True))),
    Case("ernie-dropped-residual", "ernie", "the feed-forward's residual is dropped", "encoder.layer.1", "own forward",
         plant=lambda m: _forward(m.encoder.layers[1], _encoder_layer_without_ffn_residual)),
    Case("bart-activation-relu", "bart", "the encoder's FFN activation is ReLU (torch: GELU)",
         "encoder.layers.0.activation_fn", "activation variant",
         plant=lambda m: _set_activation(m.encoder.encoder.layers[0], _paddle().nn.ReLU())),
    Case("bart-cross-attention-dropped-residual", "bart", "the decoder's cross-attention residual is dropped",
         "decoder.layers.1", "own forward",
         plant=lambda m: _forward(m.decoder.decoder.layers[1], _decoder_layer_without_cross_residual)),
    Case("bart-cross-query-untransposed", "bart", "square cross-attention query weight untransposed",
         "decoder.layers.0.encoder_attn.q_proj", "untransposed",
         after_load=_untranspose("decoder.decoder.layers.0.cross_attn.q_proj.weight")),
    Case("bart-lm-logits-bias-not-persistable", "bart-lm", "final_logits_bias not persistable, never loaded", "",
         "buffer", plant=_logits_bias_not_persistable),
    Case("bart-lm-logits-bias-zeroed", "bart-lm", "final_logits_bias reset to zeros after loading", "", "buffer",
         after_load=lambda m: m.final_logits_bias.set_value(_paddle().zeros_like(m.final_logits_bias))),
    Case("bart-lm-layernorm-epsilon", "bart-lm", "a decoder LayerNorm epsilon 1e-3 (torch: 1e-5)",
         "model.decoder.layers.1.final_layer_norm", "epsilon",
         plant=lambda m: _set_epsilon(m.bart.decoder.decoder.layers[1].norm3, "_epsilon", 1e-3)),
    Case("mbart-dropped-residual", "mbart", "the encoder's feed-forward residual is dropped", "encoder.layers.1",
         "own forward", plant=lambda m: _forward(m.encoder.encoder.layers[1], _encoder_layer_without_ffn_residual)),
    Case("mbart-final-layernorm-epsilon", "mbart", "the decoder's final LayerNorm epsilon 1e-3 (torch: 1e-5)",
         "decoder.layer_norm", "epsilon", plant=lambda m: _set_epsilon(m.decoder.decoder.norm, "_epsilon", 1e-3)),
    Case("mbart-no-causal-mask", "mbart", "the decoder's first self-attention gets a mask that hides nothing",
         "decoder.layers.0.self_attn", "causal",
         plant=lambda m: _attention_without_causal_mask(m.decoder.decoder.layers[0].self_attn, "attn_mask")),
    Case("mixtral-routing-not-renormalized", "mixtral", "the top-2 routing weights left unnormalized",
         "model.layers.0.block_sparse_moe", "own forward",
         plant=lambda m: _forward(m.mixtral.layers[0].block_sparse_moe,
                                  functools.partial(F.moe_forward, renormalize=False))),
    Case("mixtral-expert-gelu", "mixtral", "one expert's activation is GELU (torch: SiLU)",
         "model.layers.1.block_sparse_moe.experts.2.act_fn", "activation variant",
         plant=lambda m: setattr(m.mixtral.layers[1].block_sparse_moe.experts[2], "act_fn", _paddle().nn.GELU())),
    Case("mixtral-rmsnorm-epsilon", "mixtral", "an RMSNorm with variance_epsilon 1e-5 (torch: 1e-6)",
         "model.layers.1.post_attention_layernorm", "epsilon",
         plant=lambda m: _set_epsilon(m.mixtral.layers[1].post_attention_layernorm, "variance_epsilon", 1e-5)),
    Case("clip-vision-activation-gelu", "clip-vision", "the MLP's activation is GELU (torch: quick GELU)",
         "vision_model.encoder.layers.0.mlp.activation_fn", "activation variant",
         plant=lambda m: _set_activation(m.vision_model.transformer.layers[0], _paddle().nn.GELU())),
    Case("clip-vision-pre-layernorm-epsilon", "clip-vision", "pre-encoder LayerNorm epsilon 1e-3 (torch: 1e-5)",
         "vision_model.pre_layrnorm", "epsilon",
         plant=lambda m: _set_epsilon(m.vision_model.ln_pre, "_epsilon", 1e-3)),
    Case("clip-vision-dropped-residual", "clip-vision", "the feed-forward's residual is dropped",
         "vision_model.encoder.layers.1", "own forward",
         plant=lambda m: _forward(m.vision_model.transformer.layers[1], _encoder_layer_without_ffn_residual)),
    Case("clip-text-no-causal-mask", "clip-text", "attention gets a mask that hides nothing",
         "text_model.encoder.layers.1.self_attn", "causal",
         plant=lambda m: _attention_without_causal_mask(m.text_model.transformer.layers[1].self_attn, "attn_mask")),
    Case("clip-text-final-layernorm-epsilon", "clip-text", "final LayerNorm epsilon 1e-3 (torch: 1e-5)",
         "text_model.final_layer_norm", "epsilon",
         plant=lambda m: _set_epsilon(m.text_model.ln_final, "_epsilon", 1e-3)),
    Case("clip-text-out-proj-untransposed", "clip-text", "square out_proj weight loaded without its transpose",
         "text_model.encoder.layers.0.self_attn.out_proj", "untransposed",
         after_load=_untranspose("text_model.transformer.layers.0.self_attn.out_proj.weight")),
    Case("bloom-qkv-split-by-kind", "bloom", "the fused qkv output split as [q | k | v] (it is per head)",
         "h.0.self_attention", "own forward",
         plant=lambda m: _t5_method(m.h[0].self_attention, "_split_heads", _bloom_split_by_kind)),
    Case("bloom-gelu-exact", "bloom", "the MLP's GELU in its exact form (torch: the tanh form)", "h.1.mlp.gelu_impl",
         "GELU", plant=lambda m: setattr(m.h[1].mlp, "gelu_impl", _paddle().nn.GELU())),
    Case("bloom-layernorm-epsilon", "bloom", "a LayerNorm built with epsilon 1e-3 (torch: 1e-5)",
         "h.1.post_attention_layernorm", "epsilon",
         plant=lambda m: _set_epsilon(m.h[1].post_attention_layernorm, "_epsilon", 1e-3)),
    Case("roberta-layernorm-epsilon", "roberta", "a LayerNorm built with epsilon 1e-3 (torch: 1e-5)",
         "encoder.layer.0.attention.output.LayerNorm", "epsilon",
         plant=lambda m: _set_epsilon(m.encoder.layers[0].norm1, "_epsilon", 1e-3)),
    Case("roberta-value-untransposed", "roberta", "square value weight loaded without its transpose",
         "encoder.layer.1.attention.self.value", "untransposed",
         after_load=_untranspose("encoder.layers.1.self_attn.v_proj.weight")),
    Case("electra-gelu-tanh", "electra", "GELU's tanh form where torch uses the exact one",
         "encoder.layer.0.intermediate.intermediate_act_fn", "GELU",
         plant=lambda m: _set_activation(m.encoder.layers[0], _paddle().nn.GELU(approximate=True))),
    Case("electra-embeddings-layernorm-epsilon", "electra", "embeddings LayerNorm epsilon 1e-5 (torch: 1e-12)",
         "embeddings.LayerNorm", "epsilon",
         plant=lambda m: _set_epsilon(m.embeddings.layer_norm, "_epsilon", 1e-5)),
]


def _forward_core(model, index, core):
    attention = model.gpt.decoder.layers[index].self_attn
    attention._core_attention = types.MethodType(core, attention)


CASES = CLEAN + BUGS
BY_NAME = {case.name: case for case in CASES}


def spec_functions(name: str) -> tuple:
    """(torch_model, paddle_model, inputs, mapping) of the case `name`: what its spec file defines."""
    case = BY_NAME[name]
    return (lambda: torch_model(case)), (lambda: paddle_model(case)), (lambda: inputs(case)), mapping(case)


def spec_text(case: Case) -> str:
    return (f'"""Real-model case {case.name}: {case.what or "clean pair"} (tests/real_models/cases.py)."""\n\n'
            "import os\nimport sys\n\n"
            "sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n\n"
            "from cases import spec_functions  # noqa: E402\n\n"
            f'torch_model, paddle_model, inputs, mapping = spec_functions("{case.name}")\n')


def write_specs() -> None:
    os.makedirs(SPEC_DIR, exist_ok=True)
    for case in CASES:
        with open(case.spec_path, "w") as f:
            f.write(spec_text(case))


if __name__ == "__main__":
    write_specs()
