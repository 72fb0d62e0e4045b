"""Training pair: a per-position tagger whose output is [B, C, T] (a 1x1 Conv1d head over a sequence),
trained on soft targets (a teacher's class probabilities per position) with cross-entropy over the
classes on axis 1, as torch's cross_entropy takes them; paddle's needs axis=1 said."""

import numpy as np
import paddle
import torch

B, D, C, T = 4, 6, 5, 7


class TorchTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Conv1d(D, 16, 3, padding=1)
        self.head = torch.nn.Conv1d(16, C, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.mix(x)))


class PaddleTagger(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.mix = paddle.nn.Conv1D(D, 16, 3, padding=1)
        self.head = paddle.nn.Conv1D(16, C, 1)

    def forward(self, x):
        return self.head(paddle.tanh(self.mix(x)))


def torch_model():
    torch.manual_seed(0)
    return TorchTagger()


def paddle_model():
    return PaddleTagger()


def inputs():
    return (np.random.default_rng(0).standard_normal((B, D, T)).astype(np.float32),)


def batches():
    rng = np.random.default_rng(4)
    out = []
    for _ in range(3):
        teacher = rng.dirichlet(np.ones(C), size=(B, T)).transpose(0, 2, 1)  # [B, C, T], sums to 1 over C
        out.append(((rng.standard_normal((B, D, T)).astype(np.float32),), teacher.astype(np.float32)))
    return out


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output, target)


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output, target, soft_label=True, axis=1)


def torch_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
