"""The seed report's shape: a LayerNorm, then a square 1536x1536 query_proj, and an HF GPT-2
style Conv1D (weight stored [in, out]) beside it. A shape check cannot catch a missed
transpose of query_proj; the Conv1D must not be transposed at all."""

import numpy as np
import paddle
import torch

D = 1536


class Conv1D(torch.nn.Module):
    """As in HF transformers' GPT-2: y = x @ weight + bias, weight [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = torch.nn.Parameter(torch.randn(nf) * 0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.query_proj = torch.nn.Linear(D, D)
        self.c_attn = Conv1D(96, D)

    def forward(self, x):
        h = self.norm(x)
        return self.query_proj(h) + self.c_attn(h).sum(-1, keepdim=True)


class PaddleBlock(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.norm = paddle.nn.LayerNorm(D)
        self.query_proj = paddle.nn.Linear(D, D)
        self.c_attn = paddle.nn.Linear(D, 96)

    def forward(self, x):
        h = self.norm(x)
        return self.query_proj(h) + self.c_attn(h).sum(-1, keepdim=True)


def torch_model():
    torch.manual_seed(4)
    return TorchBlock()


def paddle_model():
    return PaddleBlock()


def inputs():
    return (np.random.default_rng(4).standard_normal((4, 8, D)).astype(np.float32),)
