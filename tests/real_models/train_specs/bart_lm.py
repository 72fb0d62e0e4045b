"""verify-port --train spec: HF BartForConditionalGeneration (its head untied from the shared
embedding, as PaddleNLP's `lm_head_weight` is a parameter of its own) against PaddleNLP's, trained
as a sequence-to-sequence model: cross-entropy with label smoothing 0.1 over the decoder's tokens
(the pad id 0 ignored), AdamW with a linear warmup and a linear decay, dropout 0.1 everywhere.

    verify-port --spec tests/real_models/train_specs/bart_lm.py --train --steps 10
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import families as F  # noqa: E402

mapping = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bart.json")
DROPOUT = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, tie_word_embeddings=False)
PAD = 0
SMOOTHING = 0.1
WARMUP, STEPS = 3, 10


def torch_model():
    return F.bart_lm_torch(**DROPOUT)


def paddle_model():
    return F.bart_lm_paddle(**DROPOUT)


def inputs():
    return F.bart_inputs(False)


def batches():
    rng = np.random.default_rng(7)
    out = []
    for _ in range(4):
        x = F.bart_inputs(False)
        x["input_ids"] = rng.integers(1, F.VOCAB, x["input_ids"].shape).astype("int64")
        labels = rng.integers(1, F.VOCAB, x["decoder_input_ids"].shape).astype("int64")
        labels[:, -2:] = PAD  # padded targets, ignored by the loss
        out.append((x, labels))
    return out


def torch_loss(logits, labels):
    import torch
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=PAD, label_smoothing=SMOOTHING)


def paddle_loss(logits, labels):
    """The padded positions dropped first: paddle's cross_entropy with label_smoothing applies no
    ignore_index (it smooths the labels into probabilities) and averages over every class."""
    import paddle
    logits, labels = logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1])
    keep = labels != PAD
    return paddle.nn.functional.cross_entropy(logits[keep], labels[keep], label_smoothing=SMOOTHING)


def torch_optimizer(model):
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=WARMUP)
    decay = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=STEPS - WARMUP)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[WARMUP])
