"""Training pair: an MLP classifier with AdamW and a cosine schedule after a linear warmup."""

import numpy as np
import paddle
import torch

D, H, C, B = 12, 16, 5, 8


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(D, H)
        self.norm = torch.nn.LayerNorm(H)
        self.drop = torch.nn.Dropout(0.1)
        self.fc2 = torch.nn.Linear(H, C)

    def forward(self, x):
        return self.fc2(self.drop(torch.nn.functional.gelu(self.norm(self.fc1(x)))))


class PaddleMLP(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(D, H)
        self.norm = paddle.nn.LayerNorm(H)
        self.drop = paddle.nn.Dropout(0.1)
        self.fc2 = paddle.nn.Linear(H, C)

    def forward(self, x):
        return self.fc2(self.drop(paddle.nn.functional.gelu(self.norm(self.fc1(x)))))


def torch_model():
    torch.manual_seed(0)
    return TorchMLP()


def paddle_model():
    return PaddleMLP()


def inputs():
    return (np.random.default_rng(0).standard_normal((B, D)).astype(np.float32),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.standard_normal((B, D)).astype(np.float32),), rng.integers(0, C, B).astype(np.int64))
            for _ in range(4)]


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output, target)


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output, target)


def torch_optimizer(model):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=4)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=16)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[4])
