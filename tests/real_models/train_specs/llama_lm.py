"""verify-port --train spec: HF LlamaForCausalLM (RMSNorm, its head untied, returning the logits
and its key/value cache as HF does by default) against PaddleNLP's, trained as a causal LM: the
next-token cross-entropy (the logits of each position against the next token), AdamW with a linear
warmup into a cosine decay.

    verify-port --spec tests/real_models/train_specs/llama_lm.py --train --steps 10
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import families as F  # noqa: E402

mapping = "llama"
WARMUP, STEPS = 3, 10


def torch_model():
    hf = F._hf()
    return F.randomize(hf.LlamaForCausalLM(hf.LlamaConfig(**F.LLAMA, attn_implementation="eager", use_cache=False)))


def paddle_model():
    return F.llama_paddle()


def inputs():
    return F.llama_inputs(True)


def batches():
    rng = np.random.default_rng(5)
    out = []
    for _ in range(4):
        x = F.llama_inputs(True)
        x["input_ids"] = rng.integers(1, F.VOCAB, x["input_ids"].shape).astype("int64")
        out.append((x, x["input_ids"]))  # the model's own tokens: each position predicts the next
    return out


def torch_loss(output, tokens):
    import torch
    logits = output.logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def paddle_loss(output, tokens):
    import paddle
    logits = (output[0] if isinstance(output, (tuple, list)) else output)[:, :-1]
    return paddle.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), tokens[:, 1:].reshape([-1]))


def torch_optimizer(model):
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=WARMUP)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - WARMUP)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[WARMUP])
