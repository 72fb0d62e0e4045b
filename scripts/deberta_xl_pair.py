"""DeBERTa-v2-xlarge at its full shape (24 layers, hidden 1536, 24 heads, intermediate 6144,
relative attention with p2c|c2p over 256 position buckets, the convolution beside the first
layer, a 128100-token vocabulary: 885 M parameters, 3.5 GB in fp32): HF transformers'
DebertaV2Model against PaddleNLP 2.8.1's, for the streamed forward check. Both libraries are
never dependencies of this project: run it in the side environment (scripts/side_env.sh).

`write_checkpoint` writes an fp32 safetensors checkpoint of random weights with realistic scales
one tensor at a time; `meta_torch_model` builds HF's model on the meta device (its weights are
streamed from the checkpoint by verify-port), `paddle_model` PaddleNLP's under LazyGuard, with a
planted bug where asked: a LayerNorm epsilon of 1e-5 (the model's is 1e-7) in the middle layer's
attention output."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "real_models"))

from families import _hf, _nlp  # noqa: E402  (the side environment's libraries, quietly)

CONFIG = dict(vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
              intermediate_size=6144, max_position_embeddings=512, hidden_act="gelu", type_vocab_size=0,
              relative_attention=True, position_buckets=256, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
              norm_rel_ebd="layer_norm", position_biased_input=False, layer_norm_eps=1e-7, conv_kernel_size=3,
              conv_act="gelu", share_att_key=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BATCH, SEQ = 2, 128
BUG_LAYER = 12
BUG = f"encoder.layer.{BUG_LAYER}.attention.output.LayerNorm"


def parameters() -> int:
    return sum(t.numel() for t in meta_torch_model().state_dict().values())


def meta_torch_model():
    import torch
    hf = _hf()
    with torch.device("meta"):
        return hf.DebertaV2Model(hf.DebertaV2Config(**CONFIG)).eval()


def paddle_model(bug: bool = False):
    import paddle
    nlp = _nlp()
    config = nlp.DebertaV2Config(**CONFIG, output_hidden_states=False)
    config.share_att_key = True
    with paddle.LazyGuard():
        model = nlp.DebertaV2Model(config)
    if bug:
        layer = model
        for part in BUG.split("."):
            layer = getattr(layer, part) if not part.isdigit() else layer[int(part)]
        layer._epsilon = 1e-5
    return model.eval()


def inputs() -> dict:
    return {"input_ids": np.random.default_rng(0).integers(1, CONFIG["vocab_size"], (BATCH, SEQ)).astype("int64")}


def _scale(model) -> dict:
    """Per state-dict key, how its random values are drawn: ("normal", mean, sd) or ("copy", key)
    for a tensor tied to another; matrices N(0, 1/fan_in), embeddings N(0, 1), norm scales
    1 + N(0, 0.1), biases N(0, 0.02)."""
    import torch
    drawn = {}
    for prefix, module in model.named_modules():
        key = lambda name, prefix=prefix: f"{prefix}.{name}" if prefix else name
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Embedding):
            drawn[key("weight")] = (0.0, 1.0)
        elif isinstance(module, torch.nn.Linear):
            drawn[key("weight")] = (0.0, module.in_features ** -0.5)
        elif isinstance(module, torch.nn.Conv1d):
            drawn[key("weight")] = (0.0, (weight.shape[1] * weight.shape[2]) ** -0.5)
        elif "Norm" in type(module).__name__ and weight is not None:
            drawn[key("weight")] = (1.0, 0.1)
        else:
            continue
        if getattr(module, "bias", None) is not None:
            drawn[key("bias")] = (0.0, 0.02)
    return drawn


def write_checkpoint(path: str) -> int:
    """An fp32 safetensors checkpoint of HF DebertaV2Model's keys (those it computes left out),
    each tensor drawn and written alone; its size in bytes."""
    import os
    import zlib

    from converter.io.base import TensorInfo
    from converter.io.safetensors_io import write_safetensors
    model = meta_torch_model()
    drawn = _scale(model)
    state = model.state_dict()
    infos = [TensorInfo(k, "float32", tuple(t.shape)) for k, t in state.items() if k in drawn]

    def produce(info):
        mean, sd = drawn[info.name]
        rng = np.random.default_rng(zlib.crc32(info.name.encode()))
        return (mean + sd * rng.standard_normal(info.shape, dtype=np.float32)).astype(np.float32)

    with open(path, "wb") as f:
        write_safetensors(f, infos, produce)
    return os.path.getsize(path)
