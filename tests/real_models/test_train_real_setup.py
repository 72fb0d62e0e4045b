"""--train set up on a real pair: HF's BertForSequenceClassification with sdpa attention, whose
attention dropout is a float attribute handed to scaled_dot_product_attention (not a module),
against PaddleNLP's, trained with AdamW and clipping. The clean pair passes (it was exit 2: torch's
forward stayed random with every dropout module at 0), and a port whose attention dropout differs
is named in the structure phase with both rates. Runs only where transformers and PaddleNLP are
installed (the side environment)."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

from converter.spec import PortSpec  # noqa: E402
from helpers.train import train_check  # noqa: E402

SPEC = '''
import sys
sys.path.insert(0, {here!r})
import numpy as np
import families as F

LABELS = 3
SIZES = dict(vocab_size=F.VOCAB, hidden_size=F.HIDDEN, num_hidden_layers=F.LAYERS, num_attention_heads=F.HEADS,
             intermediate_size=F.INTERMEDIATE, max_position_embeddings=F.MAX_POSITIONS, type_vocab_size=2,
             hidden_act="gelu", num_labels=LABELS)
mapping = "bert"
clip_grad_norm = 1.0


def torch_model():
    hf = F._hf()
    config = hf.BertConfig(**SIZES, layer_norm_eps=1e-12, attn_implementation="sdpa", hidden_dropout_prob=0.1,
                           attention_probs_dropout_prob=0.1)
    return F.randomize(hf.BertForSequenceClassification(config))


def paddle_model():
    nlp = F._nlp()
    F._paddle_seeded()
    config = nlp.BertConfig(**SIZES, hidden_dropout_prob=0.1, attention_probs_dropout_prob={paddle_attention})
    return nlp.BertForSequenceClassification(config).eval()


def inputs():
    return F.bert_inputs(True)


def batches():
    rng = np.random.default_rng(3)
    return [(dict(F.bert_inputs(True), input_ids=rng.integers(1, F.VOCAB, (F.BATCH, F.SEQ)).astype("int64")),
             rng.integers(0, LABELS, F.BATCH).astype("int64")) for _ in range(4)]


def torch_loss(output, target):
    import torch
    return torch.nn.functional.cross_entropy(output.logits, target)


def paddle_loss(output, target):
    import paddle
    return paddle.nn.functional.cross_entropy(output, target)


def torch_optimizer(model):
    import torch
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
'''


def _spec(tmp_path, paddle_attention):
    path = tmp_path / f"bert_cls_{paddle_attention}.py"
    path.write_text(SPEC.format(here=HERE, paddle_attention=paddle_attention))
    return PortSpec.from_file(str(path))


def test_a_bert_classifier_with_sdpa_attention_dropout_passes(tmp_path):
    report = train_check(_spec(tmp_path, 0.1), steps=4, device="cpu")
    assert report.first_bad is None and report.exit_code == 0, report.first_bad
    assert {r.phase for r in report.rows} >= {"loss", "backward", "lr", "optimizer", "steps"}
    assert not [r for r in report.rows if r.phase == "structure"]


def test_a_differing_attention_dropout_is_named_in_structure_with_both_rates(tmp_path):
    report = train_check(_spec(tmp_path, 0.2), steps=2, device="cpu")
    fb = report.first_bad
    assert fb.phase == "structure" and (fb.torch, fb.paddle) == ("bert.encoder.layer.0", "bert.encoder.layers.0"), fb
    assert "torch 0.1 (bert.encoder.layer.0.attention.self.dropout_prob" in fb.note, fb.note
    assert "0.2 (bert.encoder.layers.0.self_attn.dropout)" in fb.note, fb.note
    config = [r for r in report.rows if r.torch == "config.attention_probs_dropout_prob"]
    assert [r.note for r in config] == ["dropout rates differ: torch 0.1, paddle 0.2"]
    assert report.exit_code == 1
