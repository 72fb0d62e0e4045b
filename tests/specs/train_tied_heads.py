"""Training pair: a small language model whose output head holds the embedding's own Parameter on
both sides (each state dict lists that one tensor under `emb.weight` and `head.weight`).
`paddle_model(tied=False)` is the port that lost the tie: a head parameter of its own, equal at
the start."""

import numpy as np
import paddle
import torch

V, D, B, T = 11, 8, 2, 5


class TorchHead(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, h):
        return torch.nn.functional.linear(h, self.weight)


class TorchLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.proj = torch.nn.Linear(D, D)
        self.head = TorchHead(self.emb.weight)

    def forward(self, ids):
        return self.head(torch.tanh(self.proj(self.emb(ids))))


class PaddleHead(paddle.nn.Layer):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, h):
        return paddle.matmul(h, self.weight, transpose_y=True)


class PaddleLM(paddle.nn.Layer):
    def __init__(self, tied=True):
        super().__init__()
        self.emb = paddle.nn.Embedding(V, D)
        self.proj = paddle.nn.Linear(D, D)
        own = self.create_parameter([V, D]) if not tied else None
        self.head = PaddleHead(self.emb.weight if tied else own)

    def forward(self, ids):
        return self.head(paddle.tanh(self.proj(self.emb(ids))))


def torch_model():
    torch.manual_seed(0)
    return TorchLM()


def paddle_model(tied=True):
    return PaddleLM(tied)


def inputs():
    return (np.random.default_rng(0).integers(0, V, (B, T)),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.integers(0, V, (B, T)),), rng.integers(0, V, (B, T))) for _ in range(4)]


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output.reshape(-1, V), target.reshape(-1))


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output.reshape([-1, V]), target.reshape([-1]))


def torch_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
