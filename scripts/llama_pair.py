"""A Llama-shaped model in torch and its paddle port, of any size, for benchmarks: embeddings,
pre-norm blocks (RMSNorm, bias-free q/k/v/o projections, causal attention, SwiGLU feed-forward),
a final RMSNorm and an untied head. Weights are random with realistic scales.

For layer-streamed verification: `write_checkpoint` writes a checkpoint of random weights one
tensor at a time (bf16 by default: a size that does not fit in fp32 twice), `meta_torch_model`
builds the torch model on the meta device, whose weights verify-port then streams from it."""

import math

import numpy as np
import paddle
import torch

SHAPE = {"vocab": 1024, "hidden": 512, "layers": 4, "heads": 8, "ffn": 1376, "seq": 128, "batch": 2}


def resize(**sizes) -> None:
    """Change the sizes; models built afterwards use them."""
    SHAPE.update(sizes)


def parameters() -> int:
    h, f, v, n = SHAPE["hidden"], SHAPE["ffn"], SHAPE["vocab"], SHAPE["layers"]
    return 2 * v * h + n * (4 * h * h + 3 * h * f + 2 * h) + h


class TorchRMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(SHAPE["hidden"]))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        h = SHAPE["hidden"]
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(h, h, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, h = x.shape
        heads = SHAPE["heads"]
        split = lambda y: y.view(b, t, heads, h // heads).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // heads)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(scores.dtype).min)
        return self.o_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, h))


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        h, f = SHAPE["hidden"], SHAPE["ffn"]
        self.gate_proj, self.up_proj = torch.nn.Linear(h, f, bias=False), torch.nn.Linear(h, f, bias=False)
        self.down_proj = torch.nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = TorchRMSNorm(), TorchAttention()
        self.post_attention_layernorm, self.mlp = TorchRMSNorm(), TorchMLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TorchLlama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(SHAPE["vocab"], SHAPE["hidden"])
        self.layers = torch.nn.ModuleList([TorchBlock() for _ in range(SHAPE["layers"])])
        self.norm = TorchRMSNorm()
        self.lm_head = torch.nn.Linear(SHAPE["hidden"], SHAPE["vocab"], bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class PaddleRMSNorm(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.weight = self.create_parameter([SHAPE["hidden"]], default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, x):
        return self.weight * (x * paddle.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class PaddleAttention(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        h = SHAPE["hidden"]
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (paddle.nn.Linear(h, h, bias_attr=False) for _ in range(4))

    def forward(self, x):
        b, t, h = x.shape
        heads = SHAPE["heads"]
        split = lambda y: y.reshape([b, t, heads, h // heads]).transpose([0, 2, 1, 3])
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = q @ k.transpose([0, 1, 3, 2]) / math.sqrt(h // heads)
        future = paddle.triu(paddle.ones([t, t]), 1).astype("bool")
        scores = paddle.where(future, paddle.full_like(scores, float(np.finfo(np.float32).min)), scores)
        ctx = paddle.nn.functional.softmax(scores, -1) @ v
        return self.o_proj(ctx.transpose([0, 2, 1, 3]).reshape([b, t, h]))


class PaddleMLP(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        h, f = SHAPE["hidden"], SHAPE["ffn"]
        self.gate_proj, self.up_proj = paddle.nn.Linear(h, f, bias_attr=False), paddle.nn.Linear(h, f, bias_attr=False)
        self.down_proj = paddle.nn.Linear(f, h, bias_attr=False)

    def forward(self, x):
        return self.down_proj(paddle.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class PaddleBlock(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = PaddleRMSNorm(), PaddleAttention()
        self.post_attention_layernorm, self.mlp = PaddleRMSNorm(), PaddleMLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class PaddleLlama(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed_tokens = paddle.nn.Embedding(SHAPE["vocab"], SHAPE["hidden"])
        self.layers = paddle.nn.LayerList([PaddleBlock() for _ in range(SHAPE["layers"])])
        self.norm = PaddleRMSNorm()
        self.lm_head = paddle.nn.Linear(SHAPE["hidden"], SHAPE["vocab"], bias_attr=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def torch_model():
    torch.manual_seed(0)
    model = TorchLlama()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.02)
    return model.eval()


def meta_torch_model():
    with torch.device("meta"):
        return TorchLlama().eval()


def write_checkpoint(path: str, dtype: str = "bfloat16") -> int:
    """A safetensors checkpoint of TorchLlama's keys with random weights of realistic scales (norms
    uniform in [0.8, 1.2], the rest normal with sd 0.02), each tensor made and written alone; its size
    in bytes."""
    import os
    import zlib

    from converter import dtypes
    from converter.io.base import TensorInfo
    from converter.io.safetensors_io import write_safetensors
    infos = [TensorInfo(k, dtype, tuple(t.shape)) for k, t in meta_torch_model().state_dict().items()]

    def produce(info):
        rng = np.random.default_rng(zlib.crc32(info.name.encode()))
        shape = info.shape
        if info.name.endswith("layernorm.weight") or info.name == "norm.weight":
            values = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        else:
            values = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        return dtypes.f32_to_bf16(values) if dtype == "bfloat16" else values

    with open(path, "wb") as f:
        write_safetensors(f, infos, produce)
    return os.path.getsize(path)


def paddle_model():
    with paddle.LazyGuard():
        return PaddleLlama()


def inputs():
    ids = np.random.default_rng(0).integers(0, SHAPE["vocab"], (SHAPE["batch"], SHAPE["seq"])).astype("int64")
    return {"input_ids": ids}
