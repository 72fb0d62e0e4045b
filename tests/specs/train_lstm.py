"""Training pair: a 2-layer LSTM (batch first) with a linear head, trained with Adam; the default
loss (a fixed random projection of the outputs) and inputs() as every batch."""

import numpy as np
import paddle
import torch

IN, HIDDEN, OUT = 6, 8, 3


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(IN, HIDDEN, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.rnn = paddle.nn.LSTM(IN, HIDDEN, num_layers=2)
        self.head = paddle.nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def torch_model():
    torch.manual_seed(1)
    return TorchNet()


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(1).standard_normal((2, 5, IN)).astype(np.float32),)


def torch_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
