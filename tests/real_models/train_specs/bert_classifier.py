"""verify-port --train spec: HF BertForSequenceClassification (sdpa attention, dropout 0.1)
against PaddleNLP's, fine-tuned as a classifier: cross-entropy, AdamW without weight decay on
biases and LayerNorm weights, a linear warmup, gradients clipped to a global norm of 1.

    verify-port --spec tests/real_models/train_specs/bert_classifier.py --train --steps 10
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import families as F  # noqa: E402

LABELS = 3
SIZES = dict(vocab_size=F.VOCAB, hidden_size=F.HIDDEN, num_hidden_layers=F.LAYERS, num_attention_heads=F.HEADS,
             intermediate_size=F.INTERMEDIATE, max_position_embeddings=F.MAX_POSITIONS, type_vocab_size=2,
             hidden_act="gelu", num_labels=LABELS, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
mapping = "bert"
clip_grad_norm = 1.0
WARMUP = 3


def torch_model():
    hf = F._hf()
    config = hf.BertConfig(**SIZES, layer_norm_eps=1e-12, attn_implementation="sdpa")
    return F.randomize(hf.BertForSequenceClassification(config))


def paddle_model():
    nlp = F._nlp()
    F._paddle_seeded()
    return nlp.BertForSequenceClassification(nlp.BertConfig(**SIZES)).eval()


def inputs():
    return F.bert_inputs(True)


def batches():
    rng = np.random.default_rng(3)
    return [(dict(F.bert_inputs(True), input_ids=rng.integers(1, F.VOCAB, (F.BATCH, F.SEQ)).astype("int64")),
             rng.integers(0, LABELS, F.BATCH).astype("int64")) for _ in range(4)]


def torch_loss(output, target):
    import torch
    return torch.nn.functional.cross_entropy(output.logits, target)


def paddle_loss(logits, target):
    import paddle
    return paddle.nn.functional.cross_entropy(logits, target)


def decays(name: str) -> bool:
    """Weight decay on the matrices and embeddings only, not on biases and LayerNorm weights."""
    return not (name.endswith("bias") or "norm" in name.lower())


def torch_optimizer(model):
    import torch
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if decays(n)], "weight_decay": 0.01},
              {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-3)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / (WARMUP + 1)))


def paddle_optimizer(model):
    import paddle
    scheduler = paddle.optimizer.lr.LambdaDecay(1e-3, lambda step: min(1.0, (step + 1) / (WARMUP + 1)))
    names = {p.name: n for n, p in model.named_parameters()}
    opt = paddle.optimizer.AdamW(scheduler, parameters=model.parameters(), weight_decay=0.01,
                                 apply_decay_param_fun=lambda name: decays(names[name]),
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_grad_norm))
    return opt, scheduler
