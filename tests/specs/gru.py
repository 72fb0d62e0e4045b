"""A single-layer GRU, batch first, on both sides."""

import numpy as np
import paddle
import torch

IN, HIDDEN = 10, 14


def torch_model():
    torch.manual_seed(2)
    return torch.nn.GRU(IN, HIDDEN, batch_first=True)


def paddle_model():
    return paddle.nn.GRU(IN, HIDDEN)


def inputs():
    return (np.random.default_rng(2).standard_normal((2, 6, IN)).astype(np.float32),)
