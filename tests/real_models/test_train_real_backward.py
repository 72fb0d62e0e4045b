"""The backward phase of verify-port --train on HF transformers models against their PaddleNLP
ports: a BERT classifier trained with AdamW and clipping (with and without explicit position ids:
HF's positions are [1, T], PaddleNLP's [B, T]) and a Llama-like causal LM with RMSNorm (HF's
computes in float32 inside). The clean pairs pass the backward phase, well within budget; a
planted custom backward and a planted gradient scaling are named at their layer. Runs only where
transformers and PaddleNLP are installed (the side environment)."""

import os
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

from converter.spec import load_spec  # noqa: E402
from helpers.train import train_check  # noqa: E402

CLEAN_LIMIT = 0.8  # the largest clean ratio allowed here: well within budget, not at its edge

HEADER = f'''
import sys
import types

import numpy as np
import paddle
import torch

sys.path.insert(0, {HERE!r})
import families as F
'''

BERT = HEADER + '''
LABELS = 3
mapping = "bert"
clip_grad_norm = 1.0


def torch_model():
    hf = F._hf()
    config = hf.BertConfig(vocab_size=F.VOCAB, hidden_size=F.HIDDEN, num_hidden_layers=F.LAYERS,
                           num_attention_heads=F.HEADS, intermediate_size=F.INTERMEDIATE,
                           max_position_embeddings=F.MAX_POSITIONS, type_vocab_size=2, hidden_act="gelu",
                           layer_norm_eps=1e-12, attn_implementation="eager", num_labels=LABELS, **F.DROPOUTS_OFF)
    torch.manual_seed(0)
    return F.randomize(hf.BertForSequenceClassification(config))


class WrongTanh(paddle.autograd.PyLayer):
    """tanh with the derivative 1 - y instead of 1 - y^2: a custom backward with a bug."""

    @staticmethod
    def forward(ctx, x):
        y = paddle.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensor()
        return dy * (1 - y)


def _wrong_tanh(self, x):
    return WrongTanh.apply(x)


def paddle_model():
    nlp = F._nlp()
    F._paddle_seeded()
    config = nlp.BertConfig(vocab_size=F.VOCAB, hidden_size=F.HIDDEN, num_hidden_layers=F.LAYERS,
                            num_attention_heads=F.HEADS, intermediate_size=F.INTERMEDIATE,
                            max_position_embeddings=F.MAX_POSITIONS, type_vocab_size=2, hidden_act="gelu",
                            num_labels=LABELS, **F.DROPOUTS_OFF)
    model = nlp.BertForSequenceClassification(config).eval()
    if PLANT:
        model.bert.pooler.activation.forward = types.MethodType(_wrong_tanh, model.bert.pooler.activation)
    return model


def inputs():
    return F.bert_inputs(POSITIONS)


def batches():
    rng = np.random.default_rng(5)
    out = []
    for _ in range(3):
        x = F.bert_inputs(POSITIONS)
        x["input_ids"] = rng.integers(1, F.VOCAB, x["input_ids"].shape).astype("int64")
        out.append((x, rng.integers(0, LABELS, (F.BATCH,)).astype("int64")))
    return out


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output.logits, target)


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output, target)


def torch_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
'''

LLAMA = HEADER + '''
mapping = "llama"


def torch_model():
    return F.llama_torch()


class HalfGradient(paddle.autograd.PyLayer):
    """The identity whose gradient is halved: a wrong gradient scaling."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy * 0.5


def _norm_with_half_gradient(self, hidden_states):
    return type(self).forward(self, HalfGradient.apply(hidden_states))


def paddle_model():
    model = F.llama_paddle()
    if PLANT:
        norm = model.llama.layers[1].post_attention_layernorm
        norm.forward = types.MethodType(_norm_with_half_gradient, norm)
    return model


def inputs():
    return F.llama_inputs(POSITIONS)


def batches():
    rng = np.random.default_rng(5)
    out = []
    for _ in range(3):
        x = F.llama_inputs(POSITIONS)
        x["input_ids"] = rng.integers(1, F.VOCAB, x["input_ids"].shape).astype("int64")
        out.append((x, rng.integers(0, F.VOCAB, x["input_ids"].shape).astype("int64")))
    return out


def torch_loss(output, target):
    logits = output.logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def paddle_loss(output, target):
    logits = output[0] if isinstance(output, (tuple, list)) else output
    return paddle.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), target.reshape([-1]))


def torch_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
'''


def _report(tmp_path, text, plant=False, positions=True):
    path = tmp_path / "spec.py"
    path.write_text(f"PLANT = {plant!r}\nPOSITIONS = {positions!r}\n" + textwrap.dedent(text))
    return train_check(load_spec(str(path)), steps=2, device="cpu")


def _backward(report) -> list:
    return [r for r in report.rows if r.phase == "backward" and r.ratio is not None]


def _clean(report) -> float:
    rows = _backward(report)
    worst = max(rows, key=lambda r: r.ratio)
    assert worst.ratio < CLEAN_LIMIT, (worst.torch, worst.ratio, worst.note)
    left_out = [r for r in report.rows if r.phase == "backward" and r.ratio is None]
    assert not left_out, [(r.torch, r.note) for r in left_out]
    return worst.ratio


@pytest.mark.parametrize("positions", [True, False], ids=["position-ids", "no-position-ids"])
def test_a_clean_bert_classifier_passes_the_backward_phase(tmp_path, positions):
    report = _report(tmp_path, BERT, positions=positions)
    _clean(report)
    table = [r for r in _backward(report) if r.torch == "bert.embeddings.position_embeddings.weight"]
    local = [r for r in table if "local backward of bert.embeddings.position_embeddings" in r.note]
    assert len(local) == 1 and "forward differs" not in local[0].note  # [1, T, H] against [B, T, H] alike
    assert len(table) >= 4  # the embedding, the embeddings, the encoder model, the classifier, end to end


def test_a_clean_llama_with_rmsnorm_passes_the_backward_phase(tmp_path):
    report = _report(tmp_path, LLAMA)
    _clean(report)
    norms = [r for r in _backward(report) if r.torch.endswith("norm d input[0]")]
    assert {r.torch for r in norms} >= {"model.norm d input[0]", "model.layers.0.input_layernorm d input[0]",
                                       "model.layers.1.post_attention_layernorm d input[0]"}
    assert not any("narrows" in r.note for r in norms)  # HF's float32 casts kept float64 in the reference


def test_a_custom_backward_in_the_bert_pooler_is_named(tmp_path):
    report = _report(tmp_path, BERT, plant=True)
    fb = report.first_bad
    assert fb.phase == "backward" and fb.torch == "bert.pooler.activation d input[0]", fb
    assert any(d.kind == "custom backward" and d.layer == "bert.pooler.activation" for d in report.diagnosis)


def test_a_halved_gradient_in_a_llama_norm_is_named(tmp_path):
    report = _report(tmp_path, LLAMA, plant=True)
    fb = report.first_bad
    assert fb.phase == "backward" and fb.torch == "model.layers.1.post_attention_layernorm d input[0]", fb
    layer = "model.layers.1.post_attention_layernorm"
    assert any(d.kind == "custom backward" and d.layer == layer for d in report.diagnosis), report.diagnosis


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
