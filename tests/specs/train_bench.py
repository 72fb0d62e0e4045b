"""The benchmark pair of scripts/bench_train.py: a 4-layer MLP of width 256 with LayerNorm, AdamW with
a warmup and cosine schedule, cross-entropy on batches of 64. The environment variable
TRAIN_BENCH_WIDTH (bench_train.py --width) gives another width."""

import os

import numpy as np
import paddle
import torch

D, C, B, DEPTH = 128, 10, 64, 4
H = int(os.environ.get("TRAIN_BENCH_WIDTH", "256"))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(D, H)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(H, H) for _ in range(DEPTH)])
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(H) for _ in range(DEPTH)])
        self.out = torch.nn.Linear(H, C)

    def forward(self, x):
        h = self.inp(x)
        for block, norm in zip(self.blocks, self.norms):
            h = h + torch.nn.functional.gelu(block(norm(h)))
        return self.out(h)


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.inp = paddle.nn.Linear(D, H)
        self.blocks = paddle.nn.LayerList([paddle.nn.Linear(H, H) for _ in range(DEPTH)])
        self.norms = paddle.nn.LayerList([paddle.nn.LayerNorm(H) for _ in range(DEPTH)])
        self.out = paddle.nn.Linear(H, C)

    def forward(self, x):
        h = self.inp(x)
        for block, norm in zip(self.blocks, self.norms):
            h = h + paddle.nn.functional.gelu(block(norm(h)))
        return self.out(h)


def torch_model():
    torch.manual_seed(0)
    return TorchNet()


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(0).standard_normal((B, D)).astype(np.float32),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.standard_normal((B, D)).astype(np.float32),), rng.integers(0, C, B).astype(np.int64))
            for _ in range(8)]


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output, target)


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output, target)


def torch_optimizer(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
