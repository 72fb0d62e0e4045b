"""Tiny random HF transformers models (torch) and the PaddleNLP 2.8.1 ports of the same
architectures, built from one set of sizes so that the clean pairs agree to fp32 noise.

transformers and paddlenlp are imported inside the functions: this module is imported by the
case catalogue, which must load in an environment that has neither.
"""

from __future__ import annotations

import warnings

import numpy as np

SEED = 0
VOCAB = 128
HIDDEN = 32
LAYERS = 2
HEADS = 4
INTERMEDIATE = 64
MAX_POSITIONS = 64
BATCH, SEQ = 2, 12
DROPOUTS_OFF = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _hf():
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def _nlp():
    warnings.filterwarnings("ignore")
    import logging
    from paddlenlp import transformers as nlp
    from paddlenlp.utils.log import logger
    logger.set_level("ERROR")
    logging.getLogger("paddlenlp").setLevel(logging.ERROR)
    return nlp


def randomize(model, seed: int = SEED):
    """Weights that give activations of order one: matrices N(0, 1/fan_in), embeddings N(0, 1),
    norm scales 1 + N(0, 0.1), biases N(0, 0.02). HF's own init (std 0.02) leaves attention
    almost uniform, where a wrong scale or a missing mask would barely show."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    normal = lambda p, std, mean=0.0: p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    with torch.no_grad():
        for module in model.modules():
            kind = type(module).__name__
            weight = getattr(module, "weight", None)
            if isinstance(module, torch.nn.Embedding):
                normal(weight, 1.0)
            elif isinstance(module, torch.nn.Linear):
                normal(weight, module.in_features ** -0.5)
            elif kind == "Conv1D":  # HF GPT-2's Conv1D: weight already [in, out]
                normal(weight, weight.shape[0] ** -0.5)
            elif "Norm" in kind and weight is not None:
                normal(weight, 0.1, mean=1.0)
            else:
                continue
            if getattr(module, "bias", None) is not None:
                normal(module.bias, 0.02)
    return model.eval()


def _paddle_seeded():
    import paddle
    paddle.seed(SEED)
    return paddle


def token_ids(seed: int = SEED) -> np.ndarray:
    """Token ids from 1: PaddleNLP's BERT masks the pad id 0 when no mask is given, HF does not."""
    return np.random.default_rng(seed).integers(1, VOCAB, (BATCH, SEQ)).astype("int64")


def position_ids() -> np.ndarray:
    return np.tile(np.arange(SEQ, dtype="int64"), (BATCH, 1))


# ---- BERT: HF BertModel -> PaddleNLP BertModel (mapping "bert")

def bert_torch():
    hf = _hf()
    config = hf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                           intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
                           hidden_act="gelu", layer_norm_eps=1e-12, attn_implementation="eager", **DROPOUTS_OFF)
    # PaddleNLP builds every BERT layer norm with epsilon 1e-12, whatever its config says
    return randomize(hf.BertModel(config))


def bert_paddle():
    nlp = _nlp()
    _paddle_seeded()
    config = nlp.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
                            hidden_act="gelu", **DROPOUTS_OFF)
    return nlp.BertModel(config).eval()


def bert_inputs(explicit_positions: bool) -> dict:
    ids = token_ids()
    types = np.zeros_like(ids)
    types[:, SEQ // 2:] = 1
    x = {"input_ids": ids, "token_type_ids": types}
    if explicit_positions:
        x["position_ids"] = position_ids()
    return x


# ---- GPT-2: HF GPT2LMHeadModel -> PaddleNLP GPTForCausalLM (mapping "gpt2")

def gpt2_torch():
    hf = _hf()
    config = hf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
                           n_positions=MAX_POSITIONS, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                           use_cache=False)  # the logits only, as PaddleNLP returns them
    return randomize(hf.GPT2LMHeadModel(config))


def gpt2_paddle():
    nlp = _nlp()
    _paddle_seeded()
    config = nlp.GPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                           intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS,
                           hidden_act="gelu", **DROPOUTS_OFF)
    return nlp.GPTForCausalLM(config).eval()


def gpt2_inputs(explicit_positions: bool) -> dict:
    x = {"input_ids": token_ids()}
    if explicit_positions:
        x["position_ids"] = position_ids()
    return x


# ---- Llama: HF LlamaForCausalLM -> PaddleNLP LlamaForCausalLM (mapping "llama")

LLAMA = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
             num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_POSITIONS,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)


def llama_torch():
    hf = _hf()
    config = hf.LlamaConfig(**LLAMA, attn_implementation="eager", use_cache=False)  # logits only, as PaddleNLP's
    return randomize(hf.LlamaForCausalLM(config))


def llama_paddle(**overrides):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.LlamaForCausalLM(nlp.LlamaConfig(**dict(LLAMA, **overrides))).eval()


def llama_inputs(explicit_positions: bool) -> dict:
    return gpt2_inputs(explicit_positions)


# ---- DeBERTa-v2: HF DebertaV2Model -> PaddleNLP DebertaV2Model (same key names; rules inferred)

DEBERTA = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, hidden_act="gelu",
               type_vocab_size=0, relative_attention=True, position_buckets=16, max_relative_positions=-1,
               pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", position_biased_input=False,
               layer_norm_eps=1e-7, conv_kernel_size=0, **DROPOUTS_OFF)


def deberta_torch():
    hf = _hf()
    return randomize(hf.DebertaV2Model(hf.DebertaV2Config(**DEBERTA, share_att_key=True)))


def deberta_paddle():
    nlp = _nlp()
    _paddle_seeded()
    config = nlp.DebertaV2Config(**DEBERTA, output_hidden_states=False)
    config.share_att_key = True  # the modeling reads share_att_key; the config's own name is share_attn_key
    return nlp.DebertaV2Model(config).eval()


def deberta_inputs(explicit_positions: bool) -> dict:
    return {"input_ids": token_ids()}  # relative positions only: the model takes no position ids


# ---- DeBERTa-v2-xlarge's own layer shape: hidden 1536 (the 1536x1536 query_proj of the TF32 report),
# 24 heads, intermediate 6144, 256 position buckets; one layer, 32 tokens

DEBERTA_XL = dict(DEBERTA, hidden_size=1536, num_attention_heads=24, intermediate_size=6144, position_buckets=256,
                  max_position_embeddings=512, num_hidden_layers=1)
DEBERTA_XL_SEQ = 32


def deberta_xl_torch():
    hf = _hf()
    return randomize(hf.DebertaV2Model(hf.DebertaV2Config(**DEBERTA_XL, share_att_key=True)))


def deberta_xl_paddle():
    nlp = _nlp()
    _paddle_seeded()
    config = nlp.DebertaV2Config(**DEBERTA_XL, output_hidden_states=False)
    config.share_att_key = True
    return nlp.DebertaV2Model(config).eval()


def deberta_xl_inputs(explicit_positions: bool) -> dict:
    return {"input_ids": np.random.default_rng(SEED).integers(1, VOCAB, (BATCH, DEBERTA_XL_SEQ)).astype("int64")}


# ---- T5: HF T5ForConditionalGeneration -> PaddleNLP T5ForConditionalGeneration (mapping "t5")

T5 = dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=INTERMEDIATE, num_layers=LAYERS,
          num_heads=HEADS, relative_attention_num_buckets=8, dropout_rate=0.0, use_cache=False)
T5_UNTIED = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)  # v1.1; v1.0 is relu and tied
DECODER_SEQ = 7


def _t5_config(untied: bool, **config):
    return _hf().T5Config(**dict(T5, **(T5_UNTIED if untied else {}), **config))


def t5_torch(untied: bool = False, **config):
    return randomize(_hf().T5ForConditionalGeneration(_t5_config(untied, **config)))


def t5_paddle(untied: bool = False, **config):
    """The port's config is HF's translated field by field (converter.hf.config), as convert-weights
    writes it for a model directory; forced, so that a field PaddleNLP ignores (a max distance
    other than 128, which the translation refuses) is copied and the port shows what it does."""
    from converter.hf.config import translate_config
    nlp = _nlp()
    _paddle_seeded()
    translated = translate_config(_t5_config(untied, **config).to_dict(), force=True).config
    return nlp.T5ForConditionalGeneration(nlp.T5Config(**translated)).eval()


def t5_untied_torch(**config):
    return t5_torch(untied=True, **config)


def t5_untied_paddle(**config):
    return t5_paddle(untied=True, **config)


def t5_inputs(explicit_positions: bool) -> dict:
    """Encoder and decoder tokens; relative positions only, so no position ids."""
    decoder = np.random.default_rng(SEED + 1).integers(1, VOCAB, (BATCH, DECODER_SEQ)).astype("int64")
    return {"input_ids": token_ids(), "decoder_input_ids": decoder}


# ---- OPT: HF OPTModel -> PaddleNLP OPTModel (mapping "opt")

OPT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, word_embed_proj_dim=HIDDEN, num_hidden_layers=LAYERS,
           num_attention_heads=HEADS, ffn_dim=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS,
           dropout=0.0, attention_dropout=0.0, use_cache=False)  # the hidden states only, as PaddleNLP's


def _opt_config(**config):
    return _hf().OPTConfig(**dict(OPT, **config))


def opt_torch(**config):
    return randomize(_hf().OPTModel(_opt_config(**config)))


def opt_paddle(**config):
    """The port's config is HF's translated by converter.hf.config, as for T5."""
    from converter.hf.config import translate_config
    nlp = _nlp()
    _paddle_seeded()
    translated = translate_config(_opt_config(**config).to_dict()).config
    return nlp.OPTModel(nlp.OPTConfig(**translated)).eval()


def opt_inputs(explicit_positions: bool) -> dict:
    """Token ids and an attention mask (both sides derive the learned positions from it; neither
    takes position ids)."""
    ids = token_ids()
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


# ---- Mistral onto PaddleNLP's Llama: HF MistralForCausalLM -> PaddleNLP LlamaForCausalLM (mapping "llama"),
# grouped-query attention (4 heads share 2 key/value heads)

MISTRAL = dict(LLAMA, num_key_value_heads=2)


def mistral_torch(**config):
    hf = _hf()
    config = hf.MistralConfig(**dict(MISTRAL, **config), sliding_window=MAX_POSITIONS, attn_implementation="eager",
                              use_cache=False)
    return randomize(hf.MistralForCausalLM(config))


def mistral_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.LlamaForCausalLM(nlp.LlamaConfig(**dict(MISTRAL, **config))).eval()


# ---- ERNIE 3.0: HF ErnieModel -> PaddleNLP ErnieModel (mapping "bert": the same names as BERT's)

ERNIE = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
             intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
             hidden_act="gelu", use_task_id=False, **DROPOUTS_OFF)


def ernie_torch(**config):
    hf = _hf()
    # PaddleNLP builds every ERNIE layer norm with epsilon 1e-12, whatever its config says
    config = hf.ErnieConfig(**dict(ERNIE, **config), layer_norm_eps=1e-12, attn_implementation="eager")
    return randomize(hf.ErnieModel(config))


def ernie_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.ErnieModel(nlp.ErnieConfig(**dict(ERNIE, **config))).eval()


def ernie_inputs(explicit_positions: bool) -> dict:
    return bert_inputs(explicit_positions)


# ---- BART: HF BartModel -> PaddleNLP BartModel (rules: bart.json), a post-norm encoder-decoder with
# learned positions offset by 2 and a layer norm on the embeddings

BART = dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
            encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=INTERMEDIATE,
            decoder_ffn_dim=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, activation_function="gelu",
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, scale_embedding=False)


def bart_torch(**config):
    hf = _hf()
    config = hf.BartConfig(**dict(BART, **config), attn_implementation="eager", use_cache=False)
    return randomize(hf.BartModel(config))


def bart_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.BartModel(nlp.BartConfig(**dict(BART, **config), use_cache=False)).eval()


def bart_inputs(explicit_positions: bool) -> dict:
    """Encoder and decoder tokens from 1 (the pad id is 0); neither side takes position ids."""
    return t5_inputs(explicit_positions)


# ---- CLIP: HF CLIPVisionModel / CLIPTextModel -> PaddleNLP's (rules: clip.json), pre-norm towers with
# quick GELU; the vision tower is a ViT (a patch convolution, a class token, learned positions)

IMAGE, PATCH, CHANNELS = 32, 8, 3
CLIP = dict(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            hidden_act="quick_gelu", layer_norm_eps=1e-5, attention_dropout=0.0)
CLIP_VISION = dict(CLIP, image_size=IMAGE, patch_size=PATCH, num_channels=CHANNELS)
# eos id 2: both sides pool the text at the largest token id (the legacy rule)
CLIP_TEXT = dict(CLIP, vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS, eos_token_id=2, pad_token_id=1)


def clip_vision_torch(**config):
    hf = _hf()
    config = hf.CLIPVisionConfig(**dict(CLIP_VISION, **config), attn_implementation="eager")
    return randomize(hf.CLIPVisionModel(config))


def clip_vision_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.CLIPVisionModel(nlp.CLIPVisionConfig(**dict(CLIP_VISION, **config))).eval()


def clip_vision_inputs(explicit_positions: bool) -> dict:
    rng = np.random.default_rng(SEED)
    return {"pixel_values": rng.standard_normal((BATCH, CHANNELS, IMAGE, IMAGE)).astype("float32")}


def clip_text_torch(**config):
    hf = _hf()
    config = hf.CLIPTextConfig(**dict(CLIP_TEXT, **config), attn_implementation="eager")
    return randomize(hf.CLIPTextModel(config))


def clip_text_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.CLIPTextModel(nlp.CLIPTextConfig(**dict(CLIP_TEXT, **config))).eval()


def clip_text_inputs(explicit_positions: bool) -> dict:
    return gpt2_inputs(explicit_positions)


# ---- BLOOM: HF BloomModel -> PaddleNLP BloomModel (mapping "bloom"), a fused query_key_value and ALiBi

BLOOM = dict(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS, layer_norm_epsilon=1e-5,
             hidden_dropout=0.0, attention_dropout=0.0)


def bloom_torch(**config):
    hf = _hf()
    return randomize(hf.BloomModel(hf.BloomConfig(**dict(BLOOM, **config), use_cache=False)))


def bloom_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.BloomModel(nlp.BloomConfig(**dict(BLOOM, **config), use_cache=False)).eval()


def bloom_inputs(explicit_positions: bool) -> dict:
    ids = token_ids()
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


# ---- RoBERTa: HF RobertaModel -> PaddleNLP RobertaModel (mapping "roberta"): positions offset by the pad id

# positions start after the pad id on both sides: the table holds pad id + 1 rows more
ROBERTA = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1,
               pad_token_id=1, hidden_act="gelu", layer_norm_eps=1e-5, **DROPOUTS_OFF)


def roberta_torch(**config):
    hf = _hf()
    return randomize(hf.RobertaModel(hf.RobertaConfig(**dict(ROBERTA, **config), attn_implementation="eager")))


def roberta_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.RobertaModel(nlp.RobertaConfig(**dict(ROBERTA, **config))).eval()


def roberta_inputs(explicit_positions: bool) -> dict:
    """Token ids from 2 (1 is the pad id); positions derived from them on both sides."""
    return {"input_ids": np.random.default_rng(SEED).integers(2, VOCAB, (BATCH, SEQ)).astype("int64")}


# ---- ELECTRA: HF ElectraModel -> PaddleNLP ElectraModel (mapping "electra"), embeddings narrower than the
# encoder (embeddings_project)

ELECTRA = dict(vocab_size=VOCAB, embedding_size=HIDDEN // 2, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS,
               type_vocab_size=2, hidden_act="gelu", **DROPOUTS_OFF)


def electra_torch(**config):
    hf = _hf()
    return randomize(hf.ElectraModel(hf.ElectraConfig(**dict(ELECTRA, **config), layer_norm_eps=1e-12,
                                                      attn_implementation="eager")))


def electra_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.ElectraModel(nlp.ElectraConfig(**dict(ELECTRA, **config))).eval()


def electra_inputs(explicit_positions: bool) -> dict:
    return bert_inputs(explicit_positions)


# ---- mBART: HF MBartModel -> PaddleNLP MBartModel (rules: bart.json), a pre-norm encoder-decoder with a
# final layer norm on each side

def mbart_torch(**config):
    hf = _hf()
    config = hf.MBartConfig(**dict(BART, **config), attn_implementation="eager", use_cache=False)
    return randomize(hf.MBartModel(config))


def mbart_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.MBartModel(nlp.MBartConfig(**dict(BART, **config), use_cache=False)).eval()


# ---- Mixtral: HF MixtralForCausalLM -> PaddleNLP MixtralForCausalLM (mapping "mixtral"), a sparse MoE
# (4 experts, 2 per token) and grouped-query attention

MIXTRAL = dict(MISTRAL, num_local_experts=4, num_experts_per_tok=2, output_router_logits=False)


def mixtral_torch(**config):
    hf = _hf()
    config = hf.MixtralConfig(**dict(MIXTRAL, **config), sliding_window=MAX_POSITIONS, attn_implementation="eager",
                              use_cache=False)
    return randomize(hf.MixtralForCausalLM(config))


def moe_forward(self, hidden_states, renormalize: bool = True):
    """PaddleNLP 2.8.1's MixtralSparseMoeBlock.forward, the same math with one reshape: under paddle
    3.x, paddle.where(cond) returns 1-D indices, so its routing weights came out [N], not [N, 1],
    and did not broadcast against the experts' [N, H] outputs (the forward raised). `renormalize`
    False leaves the top-k routing weights as the softmax gave them (a porting bug)."""
    import paddle
    F_ = paddle.nn.functional
    batch, seq, hidden = hidden_states.shape
    hidden_states = hidden_states.reshape([-1, hidden])
    router_logits = self.gate(hidden_states)
    routing = F_.softmax(router_logits.astype("float32"), axis=1)
    routing, selected = paddle.topk(routing, self.top_k, axis=-1)
    if renormalize:
        routing = routing / routing.sum(axis=-1, keepdim=True)
    routing = routing.astype(hidden_states.dtype)
    out = paddle.zeros([batch * seq, hidden], dtype=hidden_states.dtype)
    expert_mask = F_.one_hot(selected, num_classes=self.num_experts).transpose([2, 1, 0])
    for expert_id in range(self.num_experts):
        idx, top_x = paddle.where(expert_mask[expert_id])
        idx, top_x = idx.reshape([-1]), top_x.reshape([-1])
        if top_x.shape[0] == 0:
            continue
        current = self.experts[expert_id](paddle.gather(hidden_states, top_x)) * routing[top_x, idx].reshape([-1, 1])
        out.index_add_(top_x, 0, current.astype(hidden_states.dtype))
    return out.reshape([batch, seq, hidden]), router_logits


def mixtral_paddle(**config):
    import types
    nlp = _nlp()
    _paddle_seeded()
    model = nlp.MixtralForCausalLM(nlp.MixtralConfig(**dict(MIXTRAL, **config))).eval()
    for layer in model.mixtral.layers:  # this instance only: PaddleNLP's files are not touched
        layer.block_sparse_moe.forward = types.MethodType(moe_forward, layer.block_sparse_moe)
    return model


# ---- DeBERTa-v2 as HF's defaults build it: separate position projections (no shared attention key),
# absolute positions added to the input, token types, and embeddings narrower than the encoder (embed_proj)

DEBERTA_SEPARATE = dict(DEBERTA, type_vocab_size=2, position_biased_input=True, position_buckets=-1,
                        norm_rel_ebd="none", embedding_size=HIDDEN // 2)


def deberta_separate_torch(**config):
    hf = _hf()
    return randomize(hf.DebertaV2Model(hf.DebertaV2Config(**dict(DEBERTA_SEPARATE, **config), share_att_key=False)))


def deberta_separate_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    config = nlp.DebertaV2Config(**dict(DEBERTA_SEPARATE, **config), output_hidden_states=False)
    config.share_att_key = False  # the modeling reads share_att_key; the config's own name is share_attn_key
    return nlp.DebertaV2Model(config).eval()


def deberta_separate_inputs(explicit_positions: bool) -> dict:
    return bert_inputs(explicit_positions)


# ---- BART with its head: HF BartForConditionalGeneration -> PaddleNLP's (rules: bart.json); both hold
# final_logits_bias as a persistable buffer, added to the logits

def bart_lm_torch(**config):
    import torch
    hf = _hf()

    class BartForConditionalGenerationLogits(hf.BartForConditionalGeneration):
        """The logits only, as PaddleNLP's returns them (HF adds the encoder's last hidden state)."""
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs).logits

    config = hf.BartConfig(**dict(BART, **config), attn_implementation="eager", use_cache=False)
    model = randomize(BartForConditionalGenerationLogits(config))
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():  # zeros as built: random, so that a buffer left unloaded shows
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=gen))
    return model


def bart_lm_paddle(**config):
    nlp = _nlp()
    _paddle_seeded()
    return nlp.BartForConditionalGeneration(nlp.BartConfig(**dict(BART, **config), use_cache=False)).eval()
