"""A 2-layer bidirectional LSTM, batch first, on both sides."""

import numpy as np
import paddle
import torch

IN, HIDDEN = 12, 16


def torch_model():
    torch.manual_seed(1)
    return torch.nn.LSTM(IN, HIDDEN, num_layers=2, batch_first=True, bidirectional=True)


def paddle_model():
    return paddle.nn.LSTM(IN, HIDDEN, num_layers=2, direction="bidirect")


def inputs():
    return (np.random.default_rng(1).standard_normal((3, 9, IN)).astype(np.float32),)
