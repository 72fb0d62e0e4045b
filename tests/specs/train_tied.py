"""Training pair: a small language model whose output head shares the embedding's weight (torch
ties `head.weight` to `emb.weight`; paddle multiplies by the embedding's weight transposed).
`paddle_model(tied=False)` is the port that lost the tie: a head of its own, equal at the start."""

import numpy as np
import paddle
import torch

V, D, B, T = 11, 8, 2, 5


class TorchLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.proj = torch.nn.Linear(D, D)
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.proj(self.emb(ids))))


class PaddleLM(paddle.nn.Layer):
    def __init__(self, tied=True):
        super().__init__()
        self.tied = tied
        self.emb = paddle.nn.Embedding(V, D)
        self.proj = paddle.nn.Linear(D, D)
        if not tied:
            self.head = paddle.nn.Linear(D, V, bias_attr=False)

    def forward(self, ids):
        h = paddle.tanh(self.proj(self.emb(ids)))
        if self.tied:
            return paddle.matmul(h, self.emb.weight, transpose_y=True)
        return self.head(h)


# the tie leaves torch's head.weight nothing to map to: it is the embedding's weight
RULES = {"name": "tied-lm", "unmatched": "keep", "rules": [{"kind": "drop", "key": "head.weight"},
                                                           {"kind": "transpose", "key": "proj.weight"}]}


def torch_model():
    torch.manual_seed(0)
    return TorchLM()


def paddle_model(tied=True):
    return PaddleLM(tied)


def inputs():
    return (np.random.default_rng(0).integers(0, V, (B, T)),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.integers(0, V, (B, T)),), rng.integers(0, V, (B, T))) for _ in range(3)]


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output.reshape(-1, V), target.reshape(-1))


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output.reshape([-1, V]), target.reshape([-1]))


def torch_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
