"""Training pair: torch.nn.TransformerEncoder and paddle.nn.TransformerEncoder (dropout 0.1 on both,
which the training checks set to 0), AdamW with gradient clipping by global norm."""

import numpy as np
import paddle
import torch

D, HEADS, FF, LAYERS, B, T = 16, 2, 32, 2, 3, 5

clip_grad_norm = 0.5


def torch_model():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.1, batch_first=True)
    return torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)


def paddle_model():
    layer = paddle.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.1)
    return paddle.nn.TransformerEncoder(layer, LAYERS)


def inputs():
    return (np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32),)


def batches():
    rng = np.random.default_rng(3)
    return [((rng.standard_normal((B, T, D)).astype(np.float32),), rng.standard_normal((B, T, D)).astype(np.float32))
            for _ in range(4)]


def torch_loss(output, target):
    return torch.nn.functional.mse_loss(output, target)


def paddle_loss(output, target):
    return paddle.nn.functional.mse_loss(output, target)


def torch_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
