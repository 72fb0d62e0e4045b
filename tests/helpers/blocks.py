"""A small pair of block stacks for the strategies' tests: an input Linear, blocks of a Linear and
a GELU added to what they take, a tail Linear; `tanh_in` plants the tanh approximation in one
block's paddle GELU (a bug torch's exact GELU does not have)."""

import numpy as np
import paddle
import torch

from converter.spec import spec_from_functions

D, LAYERS, BATCH = 32, 4, 16


class TorchBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(D, D)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.GELU())
                                           for _ in range(LAYERS)])
        self.tail = torch.nn.Linear(D, D)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.tail(x)


class PaddleBlocks(paddle.nn.Layer):
    def __init__(self, tanh_in=None):
        super().__init__()
        self.embed = paddle.nn.Linear(D, D)
        self.blocks = paddle.nn.LayerList([paddle.nn.Sequential(paddle.nn.Linear(D, D),
                                                                paddle.nn.GELU(approximate=i == tanh_in))
                                           for i in range(LAYERS)])
        self.tail = paddle.nn.Linear(D, D)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.tail(x)


def blocks_spec(tanh_in=None):
    def torch_model():
        torch.manual_seed(0)
        return TorchBlocks().eval()
    inputs = lambda: (np.random.default_rng(0).standard_normal((BATCH, D)).astype("float32"),)
    return spec_from_functions(torch_model, lambda: PaddleBlocks(tanh_in), inputs)
