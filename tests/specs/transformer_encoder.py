"""torch.nn.TransformerEncoder ported to paddle.nn.TransformerEncoder."""

import numpy as np
import paddle
import torch

D, HEADS, FF, LAYERS = 32, 4, 64, 2


def torch_model():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)


def paddle_model():
    layer = paddle.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0)
    return paddle.nn.TransformerEncoder(layer, LAYERS)


def inputs():
    return (np.random.default_rng(0).standard_normal((2, 7, D)).astype(np.float32),)
