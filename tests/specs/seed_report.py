"""The seed report: a LayerNorm, then a square 1536x1536 query_proj, fp32 on both sides.

Variants for the tests: `paddle_model_silent_tf32()` computes query_proj in TF32 without
saying so (as paddle's cuBLAS default once did)."""

import numpy as np
import paddle
import torch

from converter.compare.precision import round_paddle

D = 1536


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.query_proj = torch.nn.Linear(D, D)

    def forward(self, x):
        return self.query_proj(self.norm(x))


class PaddleBlock(paddle.nn.Layer):
    def __init__(self, linear=paddle.nn.Linear):
        super().__init__()
        self.norm = paddle.nn.LayerNorm(D)
        self.query_proj = linear(D, D)

    def forward(self, x):
        return self.query_proj(self.norm(x))


class SilentTF32Linear(paddle.nn.Linear):
    """A Linear whose matmul rounds its inputs to TF32, as tensor cores do."""

    def forward(self, x):
        return paddle.matmul(round_paddle(x, "tf32"), round_paddle(self.weight, "tf32")) + self.bias


def torch_model():
    torch.manual_seed(5)
    return TorchBlock()


def paddle_model():
    return PaddleBlock()


def paddle_model_silent_tf32():
    return PaddleBlock(SilentTF32Linear)


def inputs():
    # the report's inputs, as the paddle side saw them: off by about 2.7e-8
    x = np.random.default_rng(5).standard_normal((4, 32, D)).astype(np.float32)
    return (x,)
